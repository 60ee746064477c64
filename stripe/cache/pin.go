package cache

import (
	"sync"
	"sync/atomic"
)

// Pin is a reference-counted hold on a caller's stable write buffer (see Cache.Write). The
// caller's own hold comes with NewPin; the cache adds one per 4 KiB unit it references and drops
// it after the last member write that reads the unit has completed (or the unit was overwritten
// or discarded). When the count reaches zero the release function runs, exactly once, on
// whichever goroutine dropped the last hold, and the Pin goes back to a pool: it must not be
// used after its last Drop.
type Pin struct {
	refs    atomic.Int64
	release func()
}

var pins = sync.Pool{New: func() any { return new(Pin) }}

// NewPin returns a Pin holding one reference, the caller's; release runs when the last
// reference is dropped. It does not allocate once its pool is warm.
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
