package cache

import (
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/stripe"
)

// Unit states: a head's st, one per data unit, is stripe.PlanWrite's input as it is.
const (
	stUp    = stripe.UnitUp    // the unit's data is known (in buf or refs)
	stDirty = stripe.UnitDirty // newer than the members; implies stUp
)

// Queues.
const (
	qNone = iota
	qDelayed
	qUrgent
)

type unitRef struct {
	pin *Pin
	buf []byte // stripe.UnitSize bytes of the pinned buffer
}

// head is one cached stripe.
type head struct {
	// Guarded by Cache.mu.
	stripe       int64
	bound        bool
	dirty        bool // mirror of nDirty > 0, for Flush and eviction
	lprev, lnext *head
	qprev, qnext *head
	q            uint8
	first        time.Time // when it was queued
	due          time.Time // when to write it out: WriteBackDelay after its last write, at most maxAge after first

	// Guarded by the lock of stripe while bound; by its owner while unbound.
	buf     []byte    // (D+1)×chunk: data chunk d at [d·chunk, (d+1)·chunk), then parity scratch
	st      []uint8   // per data unit (d·upc + u)
	refs    []unitRef // per data unit; nil until a unit is first referenced
	nUp     int
	nDirty  int
	mustRCW bool // a write-out failed half-way: old parity cannot be trusted
}

// alloc makes h's buffers; its chunk buffers are page-aligned (aligned.Make), as direct-I/O
// members need of every buffer they read into or write from.
func (c *Cache) alloc(h *head) {
	h.buf = aligned.Make((c.nd + 1) * int(c.chunk))
	h.st = make([]uint8, c.nd*c.upc)
}

// unit returns the head's own buffer of data unit (d, u), with capacity to the end of chunk d
// so that consecutive units can be merged into one member I/O.
func (c *Cache) unit(h *head, d, u int) []byte {
	o := int64(d)*c.chunk + int64(u)*stripe.UnitSize
	return h.buf[o : o+stripe.UnitSize : int64(d+1)*c.chunk]
}

// src returns where data unit (d, u)'s bytes are: a pinned reference or the head's buffer.
func (c *Cache) src(h *head, d, u int) []byte {
	if h.refs != nil {
		if r := h.refs[d*c.upc+u]; r.pin != nil {
			return r.buf
		}
	}
	return c.unit(h, d, u)
}

func (c *Cache) parityUnit(h *head, u int) []byte {
	o := int64(c.nd)*c.chunk + int64(u)*stripe.UnitSize
	return h.buf[o : o+stripe.UnitSize : int64(c.nd+1)*c.chunk]
}

// dropRef drops unit i's reference, if any.
func (h *head) dropRef(i int) {
	if h.refs != nil && h.refs[i].pin != nil {
		h.refs[i].pin.Drop()
		h.refs[i] = unitRef{}
	}
}

// reset forgets every unit, dropping references.
func (h *head) reset() {
	if h.refs != nil {
		for i := range h.refs {
			h.dropRef(i)
		}
	}
	clear(h.st)
	h.nUp, h.nDirty, h.mustRCW = 0, 0, false
}

func (h *head) setUp(i int) {
	if h.st[i]&stUp == 0 {
		h.st[i] |= stUp
		h.nUp++
	}
}

func (h *head) setDirty(i int) {
	h.setUp(i)
	if h.st[i]&stDirty == 0 {
		h.st[i] |= stDirty
		h.nDirty++
	}
}

// lookup returns the head bound to stripe s, or nil, and marks it recently used. The caller
// holds s's lock if it will use the head.
func (c *Cache) lookup(s int64) *head {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.heads[s]
	if h != nil {
		c.lru.remove(h)
		c.lru.pushFront(h)
	}
	return h
}

// bind binds a free or evicted head to stripe s and returns it, or nil if every head is dirty
// or busy. The caller holds s's lock and s has no head.
func (c *Cache) bind(s int64) *head {
	c.mu.Lock()
	defer c.mu.Unlock()
	var h *head
	if n := len(c.free); n > 0 {
		h, c.free = c.free[n-1], c.free[:n-1]
	} else {
		const scan = 64 // least recently used heads looked at
		v := c.lru.back()
		for i := 0; v != nil && i < scan; v, i = c.lru.prev(v), i+1 {
			if v.dirty {
				continue
			}
			own := stripe.SameLock(v.stripe, s) // we hold its lock already
			if !own && !c.locks.For(v.stripe).TryLock() {
				continue // in use
			}
			v.reset()
			if !own {
				c.locks.For(v.stripe).Unlock()
			}
			c.unbindLocked(v)
			c.free = c.free[:len(c.free)-1] // unbindLocked put it there
			c.evictions.Add(1)
			h = v
			break
		}
		if h == nil {
			c.kickLocked()
			return nil
		}
	}
	if h.buf == nil {
		c.alloc(h)
	}
	h.stripe, h.bound = s, true
	c.heads[s] = h
	c.lru.pushFront(h)
	return h
}

// unbindLocked removes h from the table and lists and puts it on the free list. The caller
// holds mu and h's stripe lock, and has reset h.
func (c *Cache) unbindLocked(h *head) {
	delete(c.heads, h.stripe)
	c.lru.remove(h)
	c.dequeueLocked(h)
	h.bound, h.dirty = false, false
	c.free = append(c.free, h)
}

func (c *Cache) dequeueLocked(h *head) {
	switch h.q {
	case qDelayed:
		c.delayed.remove(h)
	case qUrgent:
		c.urgent.remove(h)
	default:
		return
	}
	h.q = qNone
	c.queued--
}

// lruList and qList are intrusive doubly linked lists of heads, with a sentinel.
type lruList struct{ root head }

func (l *lruList) init()              { l.root.lnext, l.root.lprev = &l.root, &l.root }
func (l *lruList) back() *head        { return l.prev(&l.root) }
func (l *lruList) prev(h *head) *head { return nilIf(h.lprev, &l.root) }
func (l *lruList) pushFront(h *head) {
	h.lprev, h.lnext = &l.root, l.root.lnext
	l.root.lnext.lprev = h
	l.root.lnext = h
}
func (l *lruList) remove(h *head) {
	h.lprev.lnext, h.lnext.lprev = h.lnext, h.lprev
	h.lprev, h.lnext = nil, nil
}

type qList struct{ root head }

func (l *qList) init()        { l.root.qnext, l.root.qprev = &l.root, &l.root }
func (l *qList) front() *head { return nilIf(l.root.qnext, &l.root) }
func (l *qList) pushBack(h *head) {
	h.qnext, h.qprev = &l.root, l.root.qprev
	l.root.qprev.qnext = h
	l.root.qprev = h
}
func (l *qList) remove(h *head) {
	h.qprev.qnext, h.qnext.qprev = h.qnext, h.qprev
	h.qprev, h.qnext = nil, nil
}

func nilIf(h, root *head) *head {
	if h == root {
		return nil
	}
	return h
}
