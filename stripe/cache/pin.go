package cache

import "sync/atomic"

// Pin is a reference-counted hold on a caller's stable write buffer (see Cache.Write). The
// caller's own hold comes with NewPin; the cache adds one per 4 KiB unit it references and drops
// it after the last member write that reads the unit has completed (or the unit was overwritten
// or discarded). When the count reaches zero the release function runs, exactly once, on
// whichever goroutine dropped the last hold, and the Pin goes back to a free list: it must not
// be used after its last Drop.
type Pin struct {
	refs    atomic.Int64
	release func()
}

// pins are the Pins not in use. Most are taken by a client's goroutine and dropped by a
// write-out goroutine: a sync.Pool missed for about one pinned write in a hundred.
var pins = freeList{New: func() any { return new(Pin) }}

// NewPin returns a Pin holding one reference, the caller's; release runs when the last
// reference is dropped. It does not allocate once as many Pins as are held at once exist.
func NewPin(release func()) *Pin {
	p := pins.Get().(*Pin)
	p.release = release
	p.refs.Store(1)
	return p
}

func (p *Pin) hold() { p.refs.Add(1) }

// Drop drops one reference; the last one runs release.
func (p *Pin) Drop() {
	switch n := p.refs.Add(-1); {
	case n > 0:
		return
	case n < 0:
		panic("cache: Pin dropped more often than held")
	}
	rel := p.release
	p.release = nil
	pins.Put(p)
	if rel != nil {
		rel()
	}
}

// Unpin copies every unit the cache holds by reference to a pinned caller buffer into the
// head's own buffer, drops the reference (the buffer's release runs when its last one goes),
// and from then on copies instead of referencing. An array whose dirty stripes can no longer
// be written out (it has failed) calls it, so that its callers get their buffers back while
// what they wrote stays readable in the cache. It takes each stripe's lock in turn: the
// caller holds none.
func (c *Cache) Unpin() {
	// A fill that still saw noRefs false bound its head before this store, so the sweep below
	// finds that head; one that sees it true references nothing.
	c.noRefs.Store(true)
	c.mu.Lock()
	stripes := make([]int64, 0, len(c.heads))
	for s := range c.heads {
		stripes = append(stripes, s)
	}
	c.mu.Unlock()
	for _, s := range stripes {
		lk := c.locks.For(s)
		lk.Lock()
		c.mu.Lock()
		h := c.heads[s]
		c.mu.Unlock()
		if h != nil && h.refs != nil { // h.refs is guarded by s's lock
			for i, r := range h.refs {
				if r.pin != nil {
					copy(c.unit(h, i/c.upc, i%c.upc), r.buf)
					h.dropRef(i)
				}
			}
		}
		lk.Unlock()
	}
}
