package cache

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

func (c *Cache) kickLocked() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// dirtied records under mu that h (bound, its lock held) has dirty units: it is queued for
// write-out, at once if every unit is dirty and the write that dirtied it did not end inside a
// unit (open: a stream of writes smaller than a unit is about to fill the rest of it) —
// nothing can join it then, it goes out whole, parity from the new data alone — otherwise
// after WriteBackDelay. A head whose units are all up to date but only some dirty (the rest
// read in by an earlier write-out's reconstruct-write, or written out before) waits too,
// although its write-out would read nothing: queued at once, each later small write into the
// stripe would be written out alone, with its parity, instead of joining one write-out
// (TestSmallWritesJoin).
func (c *Cache) dirtied(h *head, open bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.dirty = true
	whole := h.nDirty == c.nd*c.upc && !open
	switch {
	case whole && h.q != qUrgent:
		c.dequeueLocked(h)
		c.urgent.pushBack(h)
		h.q = qUrgent
		c.queued++
		c.kickLocked()
	case h.q == qNone:
		h.first = time.Now()
		h.due = h.first.Add(c.delay)
		c.delayed.pushBack(h)
		h.q = qDelayed
		c.queued++
		if c.queued == 1 || c.queued > c.cap/2 {
			c.kickLocked()
		}
	case h.q == qDelayed: // still being written: wait for more
		h.due = time.Now().Add(c.delay)
		if limit := h.first.Add(maxAge * c.delay); h.due.After(limit) {
			h.due = limit
		}
	}
}

// cleaned records under mu that h (its lock held) has no dirty units left.
func (c *Cache) cleaned(h *head) {
	c.mu.Lock()
	h.dirty = false
	if h.bound {
		c.dequeueLocked(h)
	}
	c.mu.Unlock()
}

// Discard forgets the stripes [s0, s0+n), dirty units included (their references are
// released): the caller has just made them read as zeroes on every member. The caller holds
// their locks (stripe.Locks.LockSpan).
func (c *Cache) Discard(s0, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	drop := func(h *head) {
		h.reset()
		c.unbindLocked(h)
	}
	if n <= int64(len(c.heads)) {
		for s := s0; s < s0+n; s++ {
			if h := c.heads[s]; h != nil {
				drop(h)
			}
		}
		return
	}
	for s, h := range c.heads {
		if s >= s0 && s < s0+n {
			drop(h)
		}
	}
}

// writeBack writes out stripe s's head if it is dirty.
func (c *Cache) writeBack(s int64) error {
	lk := c.locks.For(s)
	lk.Lock()
	defer lk.Unlock()
	return c.WriteOutLocked(s)
}

// WriteOutLocked writes out stripe s's head if it is dirty; the caller holds s's lock (a
// rebuild or scrub that must see the stripe's latest data on the members).
func (c *Cache) WriteOutLocked(s int64) error {
	h := c.lookup(s)
	if h == nil || h.nDirty == 0 {
		return nil
	}
	if err := c.writeOut(h, s); err != nil {
		return err
	}
	c.cleaned(h)
	return nil
}

// WriteOutSpanLocked writes out the dirty heads of stripes [s0, s0+n); the caller holds their
// locks. A span with more stripes than the cache has heads (a re-add's, the whole array) is
// found by a walk of the heads, not a lookup per stripe.
func (c *Cache) WriteOutSpanLocked(s0, n int64) error {
	if n <= int64(c.cap) {
		for s := s0; s < s0+n; s++ {
			if err := c.WriteOutLocked(s); err != nil {
				return err
			}
		}
		return nil
	}
	c.mu.Lock()
	var todo []int64
	for s, h := range c.heads {
		if s >= s0 && s < s0+n && h.dirty {
			todo = append(todo, s)
		}
	}
	c.mu.Unlock()
	slices.Sort(todo)
	for _, s := range todo {
		if err := c.WriteOutLocked(s); err != nil {
			return err
		}
	}
	return nil
}

// FlushRange writes out the heads of the stripes that [off, off+n) touches.
func (c *Cache) FlushRange(off, n int64) error {
	if n <= 0 {
		return nil
	}
	ss := c.layout.StripeSize()
	var errs []error
	for s := off / ss; s <= (off+n-1)/ss; s++ {
		if err := c.writeBack(s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Flush writes out every head dirty when it is called, several stripes in parallel, and
// returns their errors together with any background write-out error since the last Flush.
// Heads whose write-out fails stay dirty. It does not sync the members.
func (c *Cache) Flush() error {
	c.mu.Lock()
	var todo []int64
	for s, h := range c.heads {
		if h.dirty {
			todo = append(todo, s)
		}
	}
	c.mu.Unlock()
	errs := make([]error, len(todo))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(c.nwb, len(todo)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(todo)); i = next.Add(1) - 1 {
				errs[i] = c.writeBack(todo[i])
			}
		})
	}
	wg.Wait()
	c.mu.Lock()
	errs = append(errs, c.err)
	c.err = nil
	c.mu.Unlock()
	return errors.Join(errs...)
}

// writeBacker is a write-out goroutine: it writes out urgent heads at once, delayed ones when
// they are due, and the oldest dirty heads regardless once more than half the cache is dirty
// (pressedLocked).
func (c *Cache) writeBacker(ctx context.Context) {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	timer := false // this goroutine waits for the next delayed head (Cache.timing)
	for {
		s, ok, wait := c.next(time.Now(), &timer)
		if !ok {
			if wait >= 0 {
				t.Reset(max(wait, c.delay/lateFraction))
			}
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-c.kick:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if err := c.writeBack(s); err != nil {
			c.mu.Lock()
			if c.err == nil {
				c.log.Error("cache: background write-out failed; the data stays dirty in the cache and the next Flush reports it", "stripe", s, "err", err)
				c.err = err
			}
			c.mu.Unlock()
		}
	}
}

// next takes the next head to write out at now off its queue (nextLocked) and returns its
// stripe, waking another write-out goroutine if another head is due already (readyLocked); or
// ok false and how long to wait: -1, until kicked, when nothing is queued or another goroutine
// already waits for the next head to fall due (Cache.timing), so that one timer, not one per
// goroutine, goes off for it. *timer says whether the caller is that goroutine (set here); a
// caller that will not wait passes nil.
func (c *Cache) next(now time.Time, timer *bool) (s int64, ok bool, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if timer != nil && *timer { // awake again: no longer waiting
		c.timing, *timer = false, false
	}
	h, wait := c.nextLocked(now)
	if h == nil {
		if wait >= 0 && timer != nil {
			if c.timing {
				wait = -1
			} else {
				c.timing, *timer = true, true
			}
		}
		return 0, false, wait
	}
	if c.readyLocked(now) {
		c.kickLocked() // more work: wake another
	}
	return h.stripe, true, 0
}

// readyLocked reports whether nextLocked at now would return a head without waiting: one is
// urgent, the cache is pressed (pressedLocked), or the oldest delayed one is due.
func (c *Cache) readyLocked(now time.Time) bool {
	if c.urgent.front() != nil || c.pressedLocked() {
		return c.queued > 0
	}
	h := c.delayed.front()
	return h != nil && !now.Before(h.due)
}

// lateFraction: a write-out goroutine waiting for the next delayed head to fall due sleeps for
// at least WriteBackDelay/lateFraction, so a head may go out that much after it is due: under
// a stream of random small writes heads fall due every few microseconds, and each wake-up then
// writes out the several that fell due meanwhile (waking others to help, next) instead of
// sleeping once for each of them.
const lateFraction = 10

// maxAge bounds, in units of WriteBackDelay, how long a partial stripe that keeps being
// written waits in the cache.
const maxAge = 8

// pressedLocked reports whether delayed heads are written out before they are due: from when
// more than half the cache is queued until no more than drainTo of it is. Writing a batch of
// heads out each time, rather than one whenever a write queues one more, lets each woken
// write-out goroutine do several.
func (c *Cache) pressedLocked() bool {
	switch {
	case c.queued > c.cap/2:
		c.pressed = true
	case c.queued <= c.cap*drainTo/8:
		c.pressed = false
	}
	return c.pressed
}

// drainTo is how much of the cache, in eighths, stays queued after it was pressed.
const drainTo = 3

// nextLocked takes the next head to write out off its queue, or returns how long to wait
// (-1: until kicked). The delayed queue is in order of first write; a head at its front that
// is still being written (its due time moved on) goes to the back, behind the others.
func (c *Cache) nextLocked(now time.Time) (*head, time.Duration) {
	if h := c.urgent.front(); h != nil {
		c.dequeueLocked(h)
		return h, 0
	}
	for range c.queued + 1 {
		h := c.delayed.front()
		if h == nil {
			return nil, -1
		}
		pressed := c.pressedLocked()
		if !pressed && !now.Before(h.due) && c.awaitedLocked(h, now) {
			h.due = h.first.Add(maxAge * c.delay) // the write that lands in it sets it back (dirtied)
		}
		if pressed || !now.Before(h.due) {
			c.dequeueLocked(h)
			return h, 0
		}
		if h.qnext == &c.delayed.root || now.Before(h.first.Add(c.delay)) {
			return nil, h.due.Sub(now)
		}
		c.delayed.remove(h)
		c.delayed.pushBack(h)
	}
	return nil, c.delayed.front().due.Sub(now)
}
