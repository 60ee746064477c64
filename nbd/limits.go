package nbd

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// budget bounds the request bytes in flight on all connections together
// (Options.MaxTotalInFlightBytes). take admits n bytes when they fit, or when nothing is in
// flight (so one oversized request can still be served); give returns them. The fast path is
// one compare-and-swap; only a reader that has to wait takes mu.
type budget struct {
	used    atomic.Int64
	max     int64
	mu      sync.Mutex
	cond    sync.Cond    // on mu; broadcast by give when waiters > 0
	waiters atomic.Int32 // readers in take's slow path; changed under mu
}

func (b *budget) tryTake(n int64) bool {
	for {
		u := b.used.Load()
		if u > 0 && u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// take waits until n bytes fit and takes them. It reports whether it had to wait.
func (b *budget) take(n int64) (waited bool) {
	if b.tryTake(n) {
		return false
	}
	b.mu.Lock()
	b.waiters.Add(1)
	for !b.tryTake(n) {
		b.cond.Wait()
	}
	b.waiters.Add(-1)
	b.mu.Unlock()
	return true
}

// give returns n bytes taken before.
func (b *budget) give(n int64) {
	b.used.Add(-n)
	if b.waiters.Load() > 0 {
		b.mu.Lock() // a waiter between its failed tryTake and Wait holds mu: no lost wake-up
		b.mu.Unlock()
		b.cond.Broadcast()
	}
}

// rateLog logs a warning at most once per second, counting the ones it held back.
type rateLog struct {
	mu         sync.Mutex // guards last and suppressed
	last       time.Time
	suppressed int
}

func (r *rateLog) warn(log *slog.Logger, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < time.Second {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Warn(msg, args...)
}
