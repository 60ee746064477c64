package cache

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// TestWriteCached: WriteCached takes whole units within a stripe into the stripe's head, its
// own or a free one, without member I/O, copying them (the caller's buffer is scribbled over
// right after each call); it declines, doing nothing (no write-through either), whatever it
// could not do without waiting or reading: a range not of whole units, a whole stripe, a range
// across stripes, a stripe whose lock is held, a stripe with no head while every head is
// dirty. Referenced (a pinned buffer's units), it releases the buffer exactly once, after the
// last write-out that reads it; the buffer is scribbled over on release, so a later read of
// it would show. After Close every member byte matches the model.
func TestWriteCached(t *testing.T) {
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	ss := l.StripeSize()
	const stripes, capacity = 8, 2
	c, mm, model := newTestCache(t, l, stripes, capacity, -1, 11)
	c.delay = time.Hour // and not started: the heads stay dirty until Close writes them out
	miss := readMembers(l, mm)
	var outstanding atomic.Int64
	write := func(off, n int64, want, pinned bool) {
		t.Helper()
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(off) ^ byte(i*7)
		}
		before := c.Counters()
		mm.mu.Lock()
		reads, written := mm.reads, mm.written
		mm.mu.Unlock()
		var release func()
		if pinned {
			outstanding.Add(1)
			var calls atomic.Int32
			release = func() {
				if calls.Add(1) != 1 {
					t.Error("released twice")
				}
				for i := range p {
					p[i] = 0xee
				}
				outstanding.Add(-1)
			}
		}
		got := c.WriteCached(p, off, pinned, release)
		if got != want {
			t.Fatalf("WriteCached at %d+%d = %v, want %v", off, n, got, want)
		}
		mm.mu.Lock()
		if mm.reads != reads || mm.written != written {
			t.Fatalf("WriteCached at %d+%d did member I/O", off, n)
		}
		mm.mu.Unlock()
		if c.Counters().WriteThroughs != before.WriteThroughs {
			t.Fatalf("WriteCached at %d+%d wrote through", off, n)
		}
		if !got {
			if pinned {
				outstanding.Add(-1) // not taken: never released
			}
			return
		}
		copy(model[off:], p)
		if !pinned {
			clear(p) // not kept
		}
		back := make([]byte, n)
		for _, e := range l.Extents(nil, off, n) {
			if err := c.ReadExtent(back[e.BufOff:e.BufOff+e.Len], e, miss); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(back, model[off:off+n]) {
			t.Fatalf("read after WriteCached at %d+%d differs", off, n)
		}
	}
	const U = stripe.UnitSize
	write(0, U, true, false)       // binds a head
	write(2*U, 3*U, true, true)    // into the same head, across a chunk boundary, referenced
	write(ss+U, U, true, false)    // a second head: the cache is full of dirty heads
	write(2*ss, U, false, true)    // no head to bind
	write(U+512, U, false, false)  // not whole units
	write(U, U/2, false, false)    //
	write(0, ss, false, true)      // a whole stripe
	write(ss-U, 2*U, false, false) // across stripes
	c.locks.For(1).Lock()          // as a write-out would
	write(ss+4*U, U, false, true)  // its lock is held
	c.locks.For(1).Unlock()        //
	write(ss+4*U, U, true, true)   // free again
	write(ss-U, U, true, false)    // the end of stripe 0
	write(3*U, U, true, true)      // over a referenced unit
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := outstanding.Load(); n != 0 {
		t.Fatalf("%d pinned buffers not released after Close", n)
	}
	check(t, l, mm, model)
}
