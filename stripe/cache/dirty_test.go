package cache

import (
	"fmt"
	"testing"

	"github.com/raid5d/raid5d/stripe"
)

// TestCacheDirty: a partial write leaves its stripe dirty, and only it, until a write-out;
// a full-stripe write and a flushed or discarded stripe are clean. Both walks (per stripe, and
// over the heads for a range larger than the cache) are exercised.
func TestCacheDirty(t *testing.T) {
	l, err := stripe.NewLayout(3, 16<<10, stripe.LeftSymmetric)
	if err != nil {
		t.Fatal(err)
	}
	const stripes = 64
	c, _, _ := newTestCache(t, l, stripes, 8, -1, 1)
	// Not started: nothing is written out behind the test's back.
	S := l.StripeSize()
	dirtyStripes := func() string {
		var s string
		for i := range int64(stripes) {
			if c.Dirty(i, 1) {
				s += fmt.Sprint(i, " ")
			}
		}
		return s
	}
	if c.Dirty(0, stripes) || dirtyStripes() != "" {
		t.Fatal("a fresh cache has dirty stripes")
	}
	write := func(off, n int64) {
		t.Helper()
		if _, err := c.Write(make([]byte, n), off, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	write(5*S+4096, 4096)  // partial: dirty
	write(9*S, S)          // whole stripe: written at once
	write(12*S-4096, 8192) // across stripes 11 and 12
	if got := dirtyStripes(); got != "5 11 12 " {
		t.Errorf("dirty stripes %q, want \"5 11 12 \"", got)
	}
	for _, tt := range []struct {
		s0, n int64
		want  bool
	}{{0, 5, false}, {0, 6, true}, {6, 5, false}, {6, 6, true}, {13, 51, false}, {0, stripes, true}, {10, 1 << 40, true}} {
		if got := c.Dirty(tt.s0, tt.n); got != tt.want {
			t.Errorf("Dirty(%d, %d) = %v, want %v", tt.s0, tt.n, got, tt.want)
		}
	}
	if err := c.FlushRange(5*S, 1); err != nil {
		t.Fatal(err)
	}
	if got := dirtyStripes(); got != "11 12 " {
		t.Errorf("after writing out stripe 5: %q", got)
	}
	c.locks.LockSpan(11, 2)
	c.Discard(11, 2)
	c.locks.UnlockSpan(11, 2)
	if c.Dirty(0, 1<<40) {
		t.Errorf("dirty after discarding the rest: %q", dirtyStripes())
	}
}
