package stripe

import "testing"

// TestLockSpan: LockSpan takes exactly the mutexes of the span's stripes, each once, for spans
// that wrap past the end of the table and spans longer than it, and UnlockSpan releases them
// all (TryLock then succeeds everywhere).
func TestLockSpan(t *testing.T) {
	for _, c := range []struct{ s0, n int64 }{
		{0, 1}, {5, 3}, {NumLocks - 2, 5}, {3*NumLocks + 1020, 10}, {7, NumLocks - 1},
		{9, NumLocks}, {9, 3 * NumLocks}, {NumLocks - 1, 1}, {NumLocks, 2},
	} {
		var l Locks
		l.LockSpan(c.s0, c.n)
		for i := range int64(NumLocks) {
			in := c.n >= NumLocks || (i-c.s0)&(NumLocks-1) < c.n
			if got := !l.mu[i].TryLock(); got != in {
				t.Fatalf("LockSpan(%d, %d): mutex %d held %v, want %v", c.s0, c.n, i, got, in)
			}
			if !in {
				l.mu[i].Unlock()
			}
		}
		l.UnlockSpan(c.s0, c.n)
		for i := range NumLocks {
			if !l.mu[i].TryLock() {
				t.Fatalf("UnlockSpan(%d, %d) left mutex %d held", c.s0, c.n, i)
			}
		}
	}
}

// BenchmarkLockSpan: a whole-stripe write's lock and unlock of its stripes (one, and 21 for a
// 1 MiB write of 48 KiB stripes).
func BenchmarkLockSpan(b *testing.B) {
	for _, n := range []int64{1, 21} {
		b.Run(map[int64]string{1: "1", 21: "21"}[n], func(b *testing.B) {
			var l Locks
			s := int64(0)
			for b.Loop() {
				l.LockSpan(s, n)
				l.UnlockSpan(s, n)
				s += n
			}
		})
	}
}
