package cache

import (
	"runtime"
	"testing"

	"github.com/raid5d/raid5d/stripe"
)

// TestPartialUnitWriteAllocs writes part of a unit, which reads the rest of it in (from its
// member, or rebuilt from the others when that member is missing), and writes it out: none of
// it allocates once the cache's pools are warm.
func TestPartialUnitWriteAllocs(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations are not counted")
	}
	l, _ := stripe.NewLayout(4, 64<<10, stripe.LeftSymmetric)
	for _, missing := range []int{-1, l.DataMember(0, 1)} {
		c, _, _ := newTestCache(t, l, 4, 0, missing, 1) // no heads: each write reads its unit in
		p := make([]byte, 512)
		off := l.ChunkSize() + 100 // data chunk 1 of stripe 0, inside its first unit
		n := testing.AllocsPerRun(100, func() {
			if _, err := c.Write(p, off, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := c.FlushRange(off, int64(len(p))); err != nil {
				t.Fatal(err)
			}
		})
		if n != 0 {
			t.Errorf("missing %d: %v allocations per partial-unit write, want 0", missing, n)
		}
	}
}

// TestAllocsAfterGC: write-outs take their workspace, write-throughs their spare head and
// pinned writes their Pin from free lists that a GC does not empty. After two GCs (a sync.Pool
// keeps what it held through one only) a partial write and its write-out, a pinned one, and a
// write-through with no head free still allocate nothing.
func TestAllocsAfterGC(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations are not counted")
	}
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	ss := l.StripeSize()
	c, _, _ := newTestCache(t, l, 8, 2, -1, 1) // not started: write-outs by FlushRange
	p := make([]byte, 2*stripe.UnitSize)
	write := func(off int64, pin *Pin) {
		if _, err := c.Write(p, off, pin != nil, pin); err != nil {
			t.Fatal(err)
		}
	}
	n := testing.AllocsPerRun(20, func() {
		runtime.GC()
		runtime.GC()
		pin := NewPin(nil)
		write(stripe.UnitSize, pin) // stripe 0, referenced
		pin.Drop()
		write(ss+stripe.UnitSize, nil) // stripe 1, copied: both heads dirty
		write(2*ss, nil)               // stripe 2: no head free, written through
		if err := c.FlushRange(0, 2*ss); err != nil {
			t.Fatal(err)
		}
	})
	if k := c.Counters(); k.WriteThroughs == 0 || k.RCWWrites+k.RMWWrites == 0 {
		t.Fatalf("counters %+v: want write-outs and write-throughs", k)
	}
	if n != 0 {
		t.Errorf("%v allocations per round of writes after two GCs, want 0", n)
	}
}
