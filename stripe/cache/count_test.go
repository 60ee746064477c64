package cache

import (
	"testing"

	"github.com/raid5d/raid5d/stripe"
)

// TestFullCountsWholeStripes: FullStripeWrites counts write-outs whose parity comes from new
// data alone, every unit of the stripe dirty. A head whose units are all up to date but only
// some dirty — a stripe read in, or written out once and then written again — is written by
// reconstruct-write from what the cache holds (no reads), and counts as one.
func TestFullCountsWholeStripes(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	ss := l.StripeSize()
	c, mm, model := newTestCache(t, l, 2, 2, -1, 1)
	for u := range ss / stripe.UnitSize { // stripe 0 a unit at a time: a head written whole
		p := model[u*stripe.UnitSize : (u+1)*stripe.UnitSize]
		if _, err := c.Write(p, u*stripe.UnitSize, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.FlushRange(0, ss); err != nil {
		t.Fatal(err)
	}
	if k := c.Counters(); k.FullStripeWrites != 1 || k.RCWWrites != 0 || k.RMWWrites != 0 {
		t.Fatalf("a stripe written whole: %d full, %d RCW, %d RMW write-outs, want 1 full", k.FullStripeWrites, k.RCWWrites, k.RMWWrites)
	}
	// The head stays, every unit up to date and clean; one unit written again.
	copy(model[stripe.UnitSize:], make([]byte, stripe.UnitSize))
	if _, err := c.Write(model[stripe.UnitSize:2*stripe.UnitSize], stripe.UnitSize, false, nil); err != nil {
		t.Fatal(err)
	}
	reads := mm.reads
	if err := c.FlushRange(0, ss); err != nil {
		t.Fatal(err)
	}
	if mm.reads != reads {
		t.Fatalf("the write-out of an up-to-date head read %d bytes", mm.reads-reads)
	}
	if k := c.Counters(); k.FullStripeWrites != 1 || k.RCWWrites != 1 || k.RMWWrites != 0 {
		t.Errorf("one unit of an up-to-date head written out: %d full, %d RCW, %d RMW write-outs in all, want 1 full and 1 RCW", k.FullStripeWrites, k.RCWWrites, k.RMWWrites)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	check(t, l, mm, model)
}
