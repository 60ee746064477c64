package cache

import (
	"testing"

	"github.com/raid5d/raid5d/stripe"
)

// TestPartialUnitWriteAllocs writes part of a unit, which reads the rest of it in (from its
// member, or rebuilt from the others when that member is missing), and writes it out: none of
// it allocates once the cache's pools are warm.
func TestPartialUnitWriteAllocs(t *testing.T) {
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
