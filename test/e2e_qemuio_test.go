package test

import (
	"fmt"
	"strings"
	"testing"
)

// qemuOp is one qemu-io command: kind is "write" (with pattern, or zeroes when zero is set),
// "discard" or "read" (verifying pattern).
type qemuOp struct {
	kind    string
	off, n  int64
	pattern byte
	fua     bool // write -f: Force Unit Access
	zero    bool // write -z: NBD_CMD_WRITE_ZEROES
	unmap   bool // with zero: write -z -u, may punch a hole
}

func (o qemuOp) command() string {
	switch o.kind {
	case "write":
		flags := ""
		if o.fua {
			flags += " -f"
		}
		if o.zero {
			flags += " -z"
			if o.unmap {
				flags += " -u"
			}
			return fmt.Sprintf("write%s %d %d", flags, o.off, o.n)
		}
		return fmt.Sprintf("write%s -P 0x%02x %d %d", flags, o.pattern, o.off, o.n)
	case "read":
		return fmt.Sprintf("read -P 0x%02x %d %d", o.pattern, o.off, o.n)
	}
	return fmt.Sprintf("%s %d %d", o.kind, o.off, o.n)
}

// qemuIO runs ops in one qemu-io session against uri and fails the test if qemu-io fails, any
// read does not match its pattern, or fewer commands completed than were given.
func qemuIO(t *testing.T, uri string, ops []qemuOp) {
	t.Helper()
	qemuIOIn(t, nil, uri, ops)
}

// qemuIOIn is qemuIO with qemu-io run under prefix (see prefixed): a client on a lab's host;
// flags are qemu-io's own (-r: read-only).
func qemuIOIn(t *testing.T, prefix []string, uri string, ops []qemuOp, flags ...string) {
	t.Helper()
	args := append([]string{"-f", "raw"}, flags...)
	want := map[string]int{}
	for _, o := range ops {
		args = append(args, "-c", o.command())
		want[map[string]string{"write": "wrote", "read": "read", "discard": "discard"}[o.kind]]++
	}
	name, args := prefixed(prefix, "qemu-io", append(args, uri)...)
	out, err := runToolErr(name, args...)
	if err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	// qemu-io has exited 0 after a mismatch in some versions: the output is the verdict.
	if strings.Contains(out, "Pattern verification failed") {
		t.Fatalf("qemu-io read back the wrong data:\n%s", out)
	}
	got := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		if verb, _, ok := strings.Cut(line, " "); ok && want[verb] > 0 && strings.Contains(line, " bytes at offset ") {
			got[verb]++
		}
	}
	for verb, n := range want {
		if got[verb] != n {
			t.Fatalf("qemu-io completed %d %q commands, want %d:\n%s", got[verb], verb, n, out)
		}
	}
}

func TestQemuIOPatterns(t *testing.T) {
	need(t, "qemu-io")
	const (
		chunk  = chunkSize
		stripe = stripeData
		mib    = 1 << 20
	)
	w := func(off, n int64, p byte) qemuOp { return qemuOp{kind: "write", off: off, n: n, pattern: p} }
	r := func(off, n int64, p byte) qemuOp { return qemuOp{kind: "read", off: off, n: n, pattern: p} }

	// Every region is disjoint from the others; within one, later commands overwrite earlier ones
	// and the reads list what must be there at the end.
	writes := []qemuOp{
		w(1000, 70000, 0x11),              // unaligned, crosses the first chunk boundary
		w(stripe-333, 1000, 0x22),         // crosses the first stripe boundary
		w(5*stripe-70001, 300007, 0x33),   // odd length across two chunks and a stripe
		w(2*mib+511, mib+3, 0x44),         // spans whole stripes, ragged both ends
		w(arraySize-100000, 100000, 0x55), // the last bytes of the array
		w(4*mib, 400000, 0x66),            // partly overwritten by the next write
		w(4*mib+100001, 50000, 0x77),
		// FUA write over three chunks and more.
		{kind: "write", off: 6*mib + 4096, n: 3*chunk + 8192, pattern: 0x78, fua: true},
		w(60*stripe, 4*stripe, 0x88), // stripe-aligned region, discarded below
		{kind: "discard", off: 60 * stripe, n: 4 * stripe},
		w(20*mib+777, 250000, 0xaa), // zeroes punched into the middle
		{kind: "write", zero: true, off: 20*mib + 10000, n: 100000},
		w(24*mib+chunk-512, 2*stripe, 0xbb), // zeroed with unmap allowed
		{kind: "write", zero: true, unmap: true, off: 24*mib + chunk - 512, n: 2 * stripe},
	}
	reads := []qemuOp{
		r(1000, 70000, 0x11),
		r(0, 1000, 0), r(71000, 1000, 0), // neighbours untouched
		r(stripe-333, 1000, 0x22),
		r(5*stripe-70001, 300007, 0x33),
		r(2*mib+511, mib+3, 0x44),
		r(2*mib, 511, 0), r(3*mib+514, 1000, 0),
		r(arraySize-100000, 100000, 0x55),
		r(4*mib, 100001, 0x66), r(4*mib+100001, 50000, 0x77), r(4*mib+150001, 400000-150001, 0x66),
		r(6*mib+4096, 3*chunk+8192, 0x78),
		r(60*stripe, 4*stripe, 0), // discard reads back as zeroes
		r(20*mib+777, 10000-777, 0xaa), r(20*mib+10000, 100000, 0), r(20*mib+110000, 250777-110000, 0xaa),
		r(24*mib+chunk-512, 2*stripe, 0),
		r(30*mib, 2*mib, 0), // never written
	}

	a := newArray(t)
	s := a.serve(t)
	qemuIO(t, s.uri, append(writes, reads...))

	// The same data after a graceful restart: it was on the members, not only in memory.
	s.stop()
	s = a.serve(t)
	qemuIO(t, s.uri, reads)
}
