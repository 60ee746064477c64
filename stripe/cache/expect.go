package cache

import (
	"sync/atomic"
	"time"
)

// Expected writes. A stream of sequential writes that are not multiples of the stripe (the
// kernel client's 128 KiB requests over 48 KiB stripes) leaves each write's partial edge
// stripes in their heads for the neighbouring write to complete; a neighbour that arrives after
// the WriteBackDelay finds its edge written out already, by a reconstruct-write or
// read-modify-write, where the two together make a whole stripe. The neighbour is usually
// known before that: the server has read its header, and its payload is on the way, or it
// waits for a worker. Expect records that, per edge stripe, and a head whose stripe a write is
// expected in is not written out when it falls due, only when that write has landed (the head
// then whole and written at once, or due WriteBackDelay after it), or at maxAge delays after
// its first write, or under cache pressure, or by a Flush. A hint: a mark lost to a slot
// another stripe took, or one never consumed (a write refused, or not written through Write),
// only changes when a head is written out, never what.

// expectSlots is the number of stripes whose expected writes are tracked at once, by stripe
// modulo expectSlots: far more than the edges of the writes a connection keeps in flight.
const expectSlots = 1024

// expectSlot tracks the writes expected in one stripe: its number plus one (0: none), how many
// writes are expected, and when the last one was announced (UnixNano).
type expectSlot struct {
	s, t atomic.Int64
	n    atomic.Int32
}

// Expect records that a write of n bytes at array offset off is coming (the server has read
// its header): its partial first and last stripes are expected to be written, and their heads
// wait for it (see above). The write itself (Write, WriteCached) consumes the mark.
func (c *Cache) Expect(off, n int64) {
	c.edges(off, n, c.expect)
}

// edges calls f with the partial first and last stripes of the write of n bytes at off (once
// when they are the same stripe), if any.
func (c *Cache) edges(off, n int64, f func(s int64)) {
	ss := c.layout.StripeSize()
	if n <= 0 || c.cap == 0 {
		return
	}
	s0, s1 := off/ss, (off+n-1)/ss
	if off%ss != 0 {
		f(s0)
	}
	if (off+n)%ss != 0 && (s1 != s0 || off%ss == 0) {
		f(s1)
	}
}

func (c *Cache) expect(s int64) {
	sl := &c.expected[s%expectSlots]
	if sl.s.Load() != s+1 {
		sl.n.Store(0)
		sl.s.Store(s + 1)
	}
	sl.n.Add(1)
	sl.t.Store(time.Now().UnixNano())
}

// arrived consumes the marks of a write of n bytes at off that Expect recorded, once its data
// is in the cache (or it failed).
func (c *Cache) arrived(off, n int64) {
	c.edges(off, n, c.arrive)
}

// Arrived consumes the marks of a write of n bytes at off that Expect recorded and that the
// caller wrote itself, not through Write (the array's placed writes, whose edges it places).
func (c *Cache) Arrived(off, n int64) { c.arrived(off, n) }

func (c *Cache) arrive(s int64) {
	sl := &c.expected[s%expectSlots]
	if sl.s.Load() == s+1 && sl.n.Add(-1) < 0 {
		sl.n.Store(0)
	}
}

// awaitedLocked reports whether h (queued, due at now) waits for an expected write: one was
// announced for its stripe within maxAge delays before now and has not arrived, and h is not
// yet maxAge delays old. Under mu.
func (c *Cache) awaitedLocked(h *head, now time.Time) bool {
	sl := &c.expected[h.stripe%expectSlots]
	if sl.s.Load() != h.stripe+1 || sl.n.Load() <= 0 {
		return false
	}
	limit := maxAge * c.delay
	return now.UnixNano()-sl.t.Load() < int64(limit) && now.Before(h.first.Add(limit))
}
