package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/stripe"
)

func runCreate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("create", "[flags] MEMBER...",
		`Writes a raid5d superblock to each MEMBER (3 to 32 of them, in role order) and makes a new
RAID-5 array of them. Existing member files and block devices are used at their size (the smallest
sets the array's size); with --size, member files that do not exist are created sparse. The data
area of every member is made to read as zeroes, so parity is consistent from the start.
Members and spares that already carry a raid5d superblock are refused unless --force is given. Spares
(--spare) are made like members and recorded in the superblocks; serve finds them by their
superblock, so give them to serve with the members.

`+directHelp, stdout)
	chunk := sizeFlag{n: stripe.DefaultChunk}
	fs.Var(&chunk, "chunk", "chunk `size`: a power of two from 4K to 4M; a full stripe is chunk × (members-1)")
	layout := fs.String("layout", stripe.DefaultAlgorithm.String(),
		"parity `layout`, as Linux md names it: left-symmetric, left-asymmetric, right-symmetric, right-asymmetric")
	var size sizeFlag
	fs.Var(&size, "size", "create member files that do not exist, sparse, of this `size` (e.g. 256M)")
	var spares stringsFlag
	fs.Var(&spares, "spare", "also make `path` a spare (repeatable): it takes over a failed member's role by itself")
	consistency := fs.String("consistency", raid.ConsistencyBitmap, "crash-consistency `policy`: bitmap (a write-intent bitmap: after a crash only the regions\n"+
		"being written are resynced), none (a full resync after every crash) or journal (every write is\n"+
		"logged to --journal first and replayed after a crash: closes the write hole of a crash while\n"+
		"degraded, at the cost of writing every byte twice and a sync per group of writes). See README, \"Crashes\"")
	journal := fs.String("journal", "", "journal `file` or block device for --consistency journal, on another disk than the members\n"+
		"(a member's own file or device is refused; a file on a member's filesystem gets a warning); a file that\n"+
		"does not exist is created with --journal-size; serve finds it by the path recorded. For testing it may\n"+
		"be a volatile:PATH spec, recorded as given with PATH made absolute")
	journalSize := sizeFlag{n: raid.DefaultJournalSize}
	fs.Var(&journalSize, "journal-size", "`size` of a journal file created by --journal (at least 1M, more for large stripes)")
	var bitmapRegion sizeFlag
	fs.Var(&bitmapRegion, "bitmap-region", "array bytes each bitmap bit covers (`size`, rounded up to a power-of-two number of stripes);\n"+
		"default: the smallest giving at most 4096 bits, and at least 4M")
	force := fs.Bool("force", false, "overwrite members and spares that already carry a raid5d superblock (destroys that array)")
	setMemberOpts := memberFlags(fs)
	setDirect := directFlag(fs)
	members, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	setMemberOpts(0)
	setDirect()
	if len(members) < stripe.MinMembers {
		return fmt.Errorf("%w: need at least %d members, got %d", errUsage, stripe.MinMembers, len(members))
	}
	if *journal != "" && *consistency != raid.ConsistencyJournal {
		return fmt.Errorf("%w: --journal needs --consistency journal", errUsage)
	}
	alg, err := stripe.ParseAlgorithm(*layout)
	if err != nil {
		return fmt.Errorf("%w: --layout: %v", errUsage, err)
	}
	a, err := raid.Create(members, raid.CreateOptions{
		Chunk:        chunk.n,
		Layout:       alg.String(),
		MemberSize:   size.n,
		Force:        *force,
		Spares:       spares,
		Consistency:  *consistency,
		BitmapRegion: bitmapRegion.n,
		JournalPath:  *journal,
		JournalSize:  journalSize.n,
	})
	if err != nil {
		return err
	}
	if *journal != "" {
		if m, ok := raid.JournalSharesFilesystem(*journal, append(members[:len(members):len(members)], spares...)); ok {
			fmt.Fprintf(stderr, "raid5d create: warning: journal %s is on the same filesystem as member %s: "+
				"one disk failure can take both; for real data put the journal on another disk\n", raid.SpecPath(*journal), m)
		}
	}
	warnWideModes(stderr, "member", members)
	warnWideModes(stderr, "spare", spares)
	if *journal != "" {
		warnWideModes(stderr, "journal", []string{*journal})
	}
	st := a.Status()
	l := a.Layout()
	n, _ := a.Size()
	if err := a.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created RAID-5 array %s: %d members, chunk %s, %s, size %s (%d bytes)\n",
		st.UUID, l.Members(), formatSize(l.ChunkSize()), l.Algorithm(), formatSize(n), n)
	for i, m := range members {
		fmt.Fprintf(stdout, "  role %d: %s\n", i, m)
	}
	for _, m := range spares {
		fmt.Fprintf(stdout, "  spare:  %s\n", m)
	}
	if j := st.Journal; j != nil {
		fmt.Fprintf(stdout, "  journal: %s (%s ring)\n", j.Path, formatSize(j.Size))
	}
	return nil
}

// warnWideModes warns about each existing file of paths (member specs: their PATH) that others
// than its owner may access: they could read the array's data from it. Files raid5d creates
// are mode 0600; block devices are left to the system's rules.
func warnWideModes(stderr io.Writer, what string, paths []string) {
	for _, p := range paths {
		file := raid.SpecPath(p)
		if fi, err := os.Stat(file); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(stderr, "raid5d create: warning: %s %s is mode %04o: other local users can read the array's data from it; chmod 600 %s\n",
				what, file, fi.Mode().Perm(), file)
		}
	}
}

// stringsFlag collects the values of a repeatable flag.
type stringsFlag []string

func (f *stringsFlag) String() string     { return strings.Join(*f, ",") }
func (f *stringsFlag) Set(s string) error { *f = append(*f, s); return nil }
