package stripe

import "sync"

// NumLocks is the size of a Locks table (a power of two).
const NumLocks = 1024

// Locks is a fixed table of stripe locks: stripe s is guarded by the mutex For(s), shared by
// every stripe congruent to s modulo NumLocks. The zero value is ready to use.
//
// A goroutine that holds several of them takes them in ascending table order (LockSpan), or
// takes the extra ones only with TryLock; together the two rules rule out deadlock. The
// Locking section of package stripe/cache lists every place that holds several.
type Locks struct {
	mu [NumLocks]sync.Mutex
}

// For returns the mutex of stripe s.
func (l *Locks) For(s int64) *sync.Mutex { return &l.mu[s&(NumLocks-1)] }

// LockSpan locks the stripes [s0, s0+n), n ≥ 1, in ascending table order (every mutex once
// when n ≥ NumLocks); UnlockSpan releases them.
func (l *Locks) LockSpan(s0, n int64) {
	lo, hi, wrap := span(s0, n)
	for i := range wrap {
		l.mu[i].Lock()
	}
	for i := lo; i < hi; i++ {
		l.mu[i].Lock()
	}
}

// UnlockSpan releases what LockSpan(s0, n) took.
func (l *Locks) UnlockSpan(s0, n int64) {
	lo, hi, wrap := span(s0, n)
	for i := range wrap {
		l.mu[i].Unlock()
	}
	for i := lo; i < hi; i++ {
		l.mu[i].Unlock()
	}
}

// span returns the table indices of stripes [s0, s0+n): [lo, hi) and, where the span wraps
// past the end of the table, [0, wrap) as well (wrap ≤ lo, so the two never overlap).
func span(s0, n int64) (lo, hi, wrap int64) {
	if n >= NumLocks {
		return 0, NumLocks, 0
	}
	lo = s0 & (NumLocks - 1)
	hi = lo + n
	if hi > NumLocks {
		return lo, NumLocks, hi - NumLocks
	}
	return lo, hi, 0
}

// SameLock reports whether stripes a and b share a mutex.
func SameLock(a, b int64) bool { return (a-b)&(NumLocks-1) == 0 }
