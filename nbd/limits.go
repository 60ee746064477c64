package nbd

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// budget bounds the request bytes in flight on all connections together
// (Options.MaxTotalInFlightBytes) and shares them among the connections when they compete.
//
// Without contention a take is one compare-and-swap: it admits n bytes when they fit, or when
// nothing is in flight (so one oversized request can still be served). Once a take has to
// wait, every take queues until the queue is empty again, and grant admits the queued ones
// in this order:
//
//   - payloads being received (mid): they fit, or else one of them at a time takes the lane,
//     which admits it past max until its payload is complete. A payload charged as it arrives
//     must never wait for other payloads that wait in turn. The lane is taken only while used
//     is within max, so the overshoot is at most one request: the next payload gets the lane
//     once the last one's bytes, past max, have come back.
//   - requests of connections holding less than their share (max divided by the connections
//     in the transmission phase; a connection holding nothing is always under it), in order;
//     one that does not fit stops the others behind it, so a large request is not starved.
//   - only when no connection under its share waits: the others, in order, likewise.
//
// So under contention one connection, or each of many, holds at most about its share, and
// every wait ends: what is held comes back when requests complete, when a payload's deadline
// closes its connection (Options.PayloadTimeout), or when a reply write gives up
// (Options.ReplyTimeout).
type budget struct {
	used    atomic.Int64
	max     int64
	conns   atomic.Int64 // connections in the transmission phase (join, leave)
	waiters atomic.Int32 // len(queue); changed under mu

	mu    sync.Mutex // guards queue and lane, and the waiting fields of the holders in queue
	queue []*holder  // takes waiting, in arrival order
	lane  *holder    // the payload admitted past max, or nil
}

// holder is one connection's part of the budget. Only the connection's reader takes; gives
// come from anywhere (workers, a device releasing a pinned buffer).
type holder struct {
	held atomic.Int64 // bytes taken and not given back

	// While queued (under budget.mu): the take's size, whether it is for a payload being
	// received, and whether it is still waiting. ready receives once it is granted.
	n       int64
	mid     bool
	waiting bool
	ready   chan struct{}
	// lane is set when grant admitted this holder's payload past max; the reader clears it
	// with endPayload.
	lane bool
}

func newHolder() *holder { return &holder{ready: make(chan struct{}, 1)} }

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

// wouldWait reports whether a take of n bytes now would wait (the reader's check before it
// holds replies back across one: admitsNow).
func (b *budget) wouldWait(n int64) bool {
	u := b.used.Load()
	return b.waiters.Load() > 0 || u > 0 && u+n > b.max
}

// take waits until n bytes may be charged to h and charges them; mid says they are for the
// payload of a request already admitted. It reports whether it had to wait.
func (b *budget) take(h *holder, n int64, mid bool) (waited bool) {
	if b.waiters.Load() == 0 && b.tryTake(n) {
		h.held.Add(n)
		return false
	}
	b.mu.Lock()
	h.n, h.mid, h.waiting = n, mid, true
	b.queue = append(b.queue, h)
	b.waiters.Add(1) // before grant's tryTake: a give that saw no waiter gave before it
	b.grant()
	waited = h.waiting
	b.mu.Unlock()
	<-h.ready
	return waited
}

// give returns n bytes h took before.
func (b *budget) give(h *holder, n int64) {
	h.held.Add(-n)
	b.used.Add(-n)
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		b.grant()
		b.mu.Unlock()
	}
}

// endPayload ends h's use of the lane, if grant gave it one. Called by the reader when a
// payload is complete or abandoned.
func (b *budget) endPayload(h *holder) {
	if !h.lane {
		return
	}
	b.mu.Lock()
	h.lane = false
	b.lane = nil
	b.grant()
	b.mu.Unlock()
}

// join and leave count the connections that share the budget.
func (b *budget) join() { b.conns.Add(1) }

func (b *budget) leave() {
	b.conns.Add(-1)
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		b.grant() // the shares grew
		b.mu.Unlock()
	}
}

// grant admits the queued takes that may go now, in the order the type's comment gives.
// Called with mu held.
func (b *budget) grant() {
	share := b.max / max(b.conns.Load(), 1)
	under := func(h *holder) bool { held := h.held.Load(); return held == 0 || held+h.n <= share }
	admit := func(h *holder) {
		h.held.Add(h.n)
		h.waiting = false
		h.ready <- struct{}{}
	}
	q := b.queue[:0]
	blocked := false // a request under its share is waiting for room: none of the others passes it
	for _, h := range b.queue {
		switch {
		case h.mid && b.tryTake(h.n):
			admit(h)
		case h.mid && (b.lane == h || b.lane == nil && b.used.Load() <= b.max):
			b.lane, h.lane = h, true
			b.used.Add(h.n)
			admit(h)
		case !h.mid && !blocked && under(h) && b.tryTake(h.n):
			admit(h)
		default:
			blocked = blocked || (!h.mid && under(h))
			q = append(q, h)
		}
	}
	if !blocked {
		kept := q[:0]
		stop := false
		for _, h := range q {
			if !h.mid && !stop && b.tryTake(h.n) {
				admit(h)
				continue
			}
			stop = stop || !h.mid
			kept = append(kept, h)
		}
		q = kept
	}
	clear(b.queue[len(q):])
	b.queue = q
	b.waiters.Store(int32(len(q)))
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
