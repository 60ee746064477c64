package main

import (
	"flag"

	"github.com/raid5d/raid5d/raid/member"
)

// directHelp is the paragraph of serve's and create's help about --direct.
const directHelp = `Direct I/O (--direct auto, on or off; default auto): members opened with O_DIRECT are read and
written without the kernel's page cache, as qemu's and nbdkit's cache=none do: no second copy of
every byte in memory, and the daemon's own stripe cache is the only cache. auto opens block
devices direct and regular files through the page cache; on opens files direct too (refused,
naming the file, where its file system cannot do it); off opens nothing direct. FLUSH still
fdatasyncs every member (the device's write cache), and reads of stripes in the stripe cache are
still answered from it. Mapped reads and writes (--mapped-reads, --mapped-writes) skip direct
members.
`

// directFlag adds --direct to fs; the function it returns, called once fs is parsed (and a
// configuration file applied), makes it the mode members are opened with (member.SetDirect).
func directFlag(fs *flag.FlagSet) func() {
	v := new(directValue)
	fs.Var(v, "direct", "open members with O_DIRECT: `mode` auto (block devices; the default), on (files too) or off (see above)")
	return func() { member.SetDirect(v.d) }
}

// directValue is --direct's flag.Value.
type directValue struct{ d member.Direct }

func (v *directValue) String() string { return v.d.String() }

func (v *directValue) Set(s string) error {
	d, err := member.ParseDirect(s)
	if err != nil {
		return err
	}
	v.d = d
	return nil
}
