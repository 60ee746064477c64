package cache

import (
	"testing"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// TestExpectedEdgeWaits: the kernel client's 128 KiB writes over 48 KiB stripes, each
// announced (Expect) before it is written, as the NBD server's reader announces a WRITE whose
// header it has read. A partial edge stripe whose neighbouring write is announced is not
// offered for write-out when its write-back delay runs out, and the neighbour, arriving after
// that, completes it: every stripe goes out whole, no read-modify-write or reconstruct-write,
// no member read (without Expect, the same schedule makes an RCW and an RMW per 384 KiB). An
// announced write that never arrives holds the edge back only until maxAge delays after its
// first write; cache pressure and Flush do not wait for it; a write that arrived consumed its
// announcement. Members compared byte for byte with the model.
func TestExpectedEdgeWaits(t *testing.T) {
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	ss := l.StripeSize()
	const req = 128 << 10
	const stripes = 48 // 18 requests of 128 KiB: 2304 KiB
	for _, expect := range []bool{true, false} {
		name := "expected"
		if !expect {
			name = "not-expected"
		}
		t.Run(name, func(t *testing.T) {
			c, mm, model := newTestCache(t, l, stripes, 64, -1, 5)
			c.delay = time.Second // times are given to next, far enough apart that the test's own time does not count
			write := func(off int64) {
				t.Helper()
				for i := range model[off : off+req] {
					model[off+int64(i)]++
				}
				if _, err := c.Write(model[off:off+req], off, false, nil); err != nil {
					t.Fatal(err)
				}
			}
			// writeOutDue plays the write-out goroutines at a time when every head's
			// write-back delay has run out (and maxAge not yet).
			writeOutDue := func() {
				t.Helper()
				at := time.Now().Add(2 * c.delay)
				for s, ok, _ := c.next(at, nil); ok; s, ok, _ = c.next(at, nil) {
					if err := c.writeBack(s); err != nil {
						t.Fatal(err)
					}
				}
			}
			if expect {
				c.Expect(0, req)
			}
			for off := int64(0); off+req <= stripes*ss; off += req {
				if expect && off+req < stripes*ss {
					c.Expect(off+req, req) // the next request's header has been read
				}
				write(off)
				writeOutDue() // the delay runs out before the next request is written
			}
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			check(t, l, mm, model)
			k := c.Counters()
			t.Logf("%+v, member bytes read %d", k, mm.reads)
			if expect && (k.RMWWrites != 0 || k.RCWWrites != 0 || mm.reads != 0) {
				t.Errorf("%d RMW and %d RCW write-outs, %d member bytes read: want none (every stripe whole)", k.RMWWrites, k.RCWWrites, mm.reads)
			}
			if !expect && (k.RMWWrites == 0 || k.RCWWrites == 0) {
				t.Errorf("%d RMW and %d RCW write-outs without Expect: want some (the test's schedule must make them)", k.RMWWrites, k.RCWWrites)
			}
		})
	}

	t.Run("bounded", func(t *testing.T) {
		c, mm, model := newTestCache(t, l, 8, 8, -1, 6)
		c.delay = time.Second
		write := func(off, n int64) {
			t.Helper()
			for i := range model[off : off+n] {
				model[off+int64(i)]++
			}
			if _, err := c.Write(model[off:off+n], off, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		offered := func(at time.Time) int64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			h, _ := c.nextLocked(at)
			if h == nil {
				return -1
			}
			return h.stripe
		}
		write(0, 16<<10) // stripe 0's first chunk, waiting for the rest
		c.Expect(16<<10, 32<<10)
		c.mu.Lock()
		first := c.heads[0].first
		c.mu.Unlock()
		if s := offered(first.Add(2 * c.delay)); s != -1 {
			t.Fatalf("stripe %d offered at twice the delay with its rest announced: want none", s)
		}
		if s := offered(first.Add(maxAge*c.delay + time.Microsecond)); s != 0 {
			t.Fatalf("offered %d at maxAge delays, the announced write never arrived: want stripe 0", s)
		}
		if err := c.writeBack(0); err != nil {
			t.Fatal(err)
		}
		// A write that arrived consumed its announcement: its own partial head goes out when due.
		c.Expect(ss, 4<<10)
		write(ss, 4<<10)
		c.mu.Lock()
		first = c.heads[1].first
		c.mu.Unlock()
		if s := offered(first.Add(2 * c.delay)); s != 1 {
			t.Fatalf("offered %d when due, its announced write arrived: want stripe 1", s)
		}
		if err := c.writeBack(1); err != nil {
			t.Fatal(err)
		}
		// Flush writes an awaited head.
		write(2*ss, 16<<10)
		c.Expect(2*ss+16<<10, 32<<10)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if c.Dirty(0, 8) {
			t.Fatal("dirty heads after Flush")
		}
		// Under pressure (more than half the heads queued) awaited heads go out.
		for s := int64(3); s < 8; s++ {
			write(s*ss, 4<<10)
			c.Expect(s*ss+4<<10, 4<<10)
		}
		if s := offered(time.Now()); s != 3 {
			t.Fatalf("offered %d with 5 of 8 heads queued: want the oldest, stripe 3", s)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		check(t, l, mm, model)
	})
}
