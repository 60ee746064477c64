package raid_test

import (
	"runtime/debug"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// TestPlacedEdges: the partial stripes at the ends of a placed write (its edges) are placed too
// when the cache holds no dirty units of them, their parity computed from all their data in
// the mappings: a clean cache head of an edge is dropped (its units would go stale: read back
// through the cache they would return the old bytes), an edge with dirty units is written as
// an ordinary write joining its head, a stream of unaligned sequential writes is placed whole,
// and writes cut short inside an edge leave every stripe consistent. Every byte is compared,
// and every stripe's parity on the member files.
func TestPlacedEdges(t *testing.T) {
	a, paths, model := placedArray(t, raid.CreateOptions{})
	ss := a.Layout().StripeSize()
	rng := newRand(41)
	placedBytes := func(want uint64, what string) {
		t.Helper()
		if c := a.Counters(); c.PlacedBytes != want {
			t.Fatalf("%s: PlacedBytes = %d, want %d", what, c.PlacedBytes, want)
		}
	}
	write := func(off int64, n int) {
		t.Helper()
		p := make([]byte, n)
		fill(rng, p)
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	var total uint64

	// Clean heads in both edge stripes (written, then written out by the flush; they stay in
	// the cache), under the new bytes: the placed write wins, on reads through the cache too.
	write(3*ss+100, 9000)
	write(7*ss+500, 9000)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 4*ss+3000)
	fill(rng, p)
	off := 3*ss + 2000
	if err := place(t, a, p, off, len(p)); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p)
	compareArray(t, a, model)
	total += uint64(len(p))
	placedBytes(total, "edges with clean heads")

	// A dirty head in the tail's stripe, none in the head's: the head edge is placed, the tail
	// goes through the cache and joins the dirty head.
	write(14*ss+25000, 9000)
	p = make([]byte, 3*ss+20000)
	fill(rng, p)
	off = 11*ss + 10000
	if err := place(t, a, p, off, len(p)); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p)
	compareArray(t, a, model)
	total += uint64(len(p) - 30000) // the tail: 14*ss to 14*ss+30000
	placedBytes(total, "a dirty tail edge")

	// A stream of sequential writes of 3.5 stripes from half a stripe in: every byte placed,
	// each shared stripe twice.
	p = make([]byte, 7*ss/2)
	off = 16*ss + ss/2
	for range 2 {
		fill(rng, p)
		if err := place(t, a, p, off, len(p)); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
		off += int64(len(p))
		total += uint64(len(p))
	}
	compareArray(t, a, model)
	placedBytes(total, "sequential unaligned writes")

	// No whole stripe: within one stripe (from its start, to its end, and inside it), and
	// across a stripe boundary (the NBD server's pieces of a WRITE still arriving).
	for _, w := range []struct{ off, n int64 }{
		{22 * ss, 5000}, {23*ss - 7000, 7000}, {23*ss + 3000, 9000}, {24*ss - 6000, 11000},
	} {
		p := make([]byte, w.n)
		fill(rng, p)
		if err := place(t, a, p, w.off, len(p)); err != nil {
			t.Fatal(err)
		}
		copy(model[w.off:], p)
		total += uint64(w.n)
	}
	compareArray(t, a, model)
	placedBytes(total, "writes with no whole stripe")

	// Cut short inside the head edge, and inside the tail edge (with progress reported in
	// the head edge and at its end): not acknowledged, not counted; the stripes hold what
	// arrived, consistent.
	p = make([]byte, 2*ss+9000)
	fill(rng, p)
	off = 25*ss - 7000
	if err := placeSteps(t, a, p, off, 3000, nil); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p[:3000])
	fill(rng, p)
	if err := placeSteps(t, a, p, off, len(p)-1000, []int{2000, 7000}); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p[:len(p)-1000])
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	compareArray(t, a, model)
	placedBytes(total, "writes cut short")
	l := a.Layout()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, paths, l, model, -1)
}

// TestPlacedWriteAllocs: in steady state a placed write allocates nothing, its edges placed
// too (a write of 3.5 stripes from half a stripe in: an edge at either end), every
// write-intent bit already set (the cleaner stopped), no GC during the count.
func TestPlacedWriteAllocs(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: allocations are not counted")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations are not counted")
	}
	a, _, model := placedArray(t, raid.CreateOptions{})
	raid.StopBitmapCleaner(a)
	ss := a.Layout().StripeSize()
	p := make([]byte, 7*ss/2)
	fill(newRand(43), p)
	vec := make([][]byte, 0, 64)
	offs := int64(len(model))/int64(len(p)) - 1
	i := int64(0)
	write := func() {
		off := ss/2 + i%offs*int64(len(p))
		i++
		v, h, ok := a.PlaceWrite(off, len(p), vec[:0])
		if !ok {
			t.Fatalf("PlaceWrite(%d, %d) declined", off, len(p))
		}
		n := 0
		for _, b := range v {
			n += copy(b, p[n:])
		}
		if err := a.CommitPlaced(h, n, true); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		write()
	}
	if c := a.Counters(); c.PlacedBytes != 100*uint64(len(p)) {
		t.Fatalf("PlacedBytes = %d, want every byte of 100 writes (%d): the edges placed", c.PlacedBytes, 100*len(p))
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	if allocs := testing.AllocsPerRun(200, write); allocs != 0 {
		t.Fatalf("%.1f allocations per placed write, want 0", allocs)
	}
}
