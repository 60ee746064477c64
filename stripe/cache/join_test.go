package cache

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// writeBackNow does in the calling goroutine what the write-out goroutines would do at once:
// it writes out every head the cache's scheduling (next) offers now, until it offers none. A
// test that calls it after each write sees write-backers that are never late.
func writeBackNow(t *testing.T, c *Cache) {
	t.Helper()
	for s, ok, _ := c.next(time.Now(), nil); ok; s, ok, _ = c.next(time.Now(), nil) {
		if err := c.writeBack(s); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSmallWritesJoin: a stream of small sequential writes (4 KiB, 512 bytes, 12 KiB not
// aligned to units) reaches the members in as few write-outs as the stream allows, counted in
// member bytes written per client byte. With 3 data chunks a stripe written out whole costs
// 4/3 (data and parity). When each stripe is written out once part-way, after its first chunk
// (as a FUA write there, or the write-back delay firing on a stalled stream, does), the
// reconstruct-write of that write-out reads the rest of the stripe in, so the head is all up to
// date but then only partly dirty; the later writes to the stripe must still join one write-out
// (5/3 in all), not each be written out alone as they come (4 KiB data and 4 KiB parity per
// write: 2.0 for 4 KiB writes, about 11 for 512-byte ones). The test plays the write-out
// goroutines (writeBackNow after every write), with a write-back delay too long to fire, and
// compares every member byte with the model at the end.
func TestSmallWritesJoin(t *testing.T) {
	l, _ := stripe.NewLayout(4, 64<<10, stripe.LeftSymmetric)
	const stripes = 16
	ss, C := l.StripeSize(), l.ChunkSize()
	for _, w := range []struct {
		name        string
		size, start int64
	}{{"4k", 4 << 10, 0}, {"512", 512, 0}, {"12k-unaligned", 12 << 10, 2 << 10}} {
		for _, split := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s-split-%v", w.name, split), func(t *testing.T) {
				c, mm, model := newTestCache(t, l, stripes, 2*stripes, -1, 7)
				c.delay = time.Hour // heads go out when whole, under pressure, or by Flush/FlushRange
				rng := rand.New(rand.NewPCG(uint64(w.size), 3))
				var client int64
				splitDone := make([]bool, stripes)
				for off := w.start; off+w.size <= stripes*ss; off += w.size {
					p := model[off : off+w.size]
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					if _, err := c.Write(p, off, false, nil); err != nil {
						t.Fatal(err)
					}
					client += w.size
					end := off + w.size
					if s := (end - 1) / ss; split && !splitDone[s] && end-s*ss >= C {
						splitDone[s] = true
						if err := c.FlushRange(off, w.size); err != nil {
							t.Fatal(err)
						}
					}
					writeBackNow(t, c)
				}
				if err := c.Flush(); err != nil {
					t.Fatal(err)
				}
				check(t, l, mm, model)
				// Each stripe written out once, whole; only the stream's last stripe may be
				// partial (a quarter of a unit per stripe allows for it).
				ideal, slack := 4.0/3, 0.25
				if split {
					// Its first chunk with parity, then the other two with theirs; a write not
					// aligned to units splits a unit between the two write-outs.
					ideal, slack = 5.0/3, 2
				}
				got := float64(mm.written) / float64(client)
				t.Logf("member bytes written per client byte: %.3f (ideal %.3f); read %.3f; %+v", got, ideal, float64(mm.reads)/float64(client), c.Counters())
				if bound := ideal + slack*stripe.UnitSize/float64(ss); got > bound {
					t.Errorf("%.3f member bytes written per client byte, want at most %.3f", got, bound)
				}
			})
		}
	}
}

// TestUpToDateHeadWaits: a head whose units are all up to date but only some dirty is not
// written out at once (later writes may join it) yet stays dirty no longer than any partial
// head: it waits for the write-back delay, which later writes extend only up to maxAge delays
// after its first, and goes out at once under pressure (more than half the heads queued) or
// when it becomes dirty in every unit.
func TestUpToDateHeadWaits(t *testing.T) {
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	const U = stripe.UnitSize
	ss := l.StripeSize()
	c, mm, model := newTestCache(t, l, 4, 4, -1, 11)
	c.delay = time.Hour
	write := func(off, n int64) {
		t.Helper()
		for i := range model[off : off+n] {
			model[off+int64(i)]++
		}
		if _, err := c.Write(model[off:off+n], off, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	queue := func(s int64) (q uint8, first, due time.Time) {
		c.mu.Lock()
		defer c.mu.Unlock()
		h := c.heads[s]
		return h.q, h.first, h.due
	}
	// Stripes 0 and 1: one unit written out by reconstruct-write, which reads the rest of its
	// column in; then every unit written once more but the first (all up to date, not all dirty).
	for s := range int64(2) {
		write(s*ss, U)
		if err := c.FlushRange(s*ss, U); err != nil {
			t.Fatal(err)
		}
		for o := s*ss + U; o < (s+1)*ss; o += U {
			write(o, U)
		}
		if q, _, _ := queue(s); q != qDelayed {
			t.Fatalf("stripe %d, up to date, dirty but in one unit: queue %d, want delayed (%d)", s, q, qDelayed)
		}
	}
	_, first, due := queue(0)
	if limit := first.Add(maxAge * c.delay); due.After(limit) {
		t.Errorf("due %v after the first write, beyond the age limit %v", due.Sub(first), limit.Sub(first))
	}
	c.mu.Lock()
	early, _ := c.nextLocked(time.Now())
	dueHead, _ := c.nextLocked(due)
	c.mu.Unlock()
	if early != nil {
		t.Errorf("stripe %d offered for write-out before its delay, with 2 of 4 heads queued", early.stripe)
	}
	if dueHead == nil || dueHead.stripe != 0 {
		t.Fatal("stripe 0 not offered for write-out when due")
	}
	// Stripe 0 is off the queue, still dirty: write it out, as a write-out goroutine would.
	if err := c.writeBack(0); err != nil {
		t.Fatal(err)
	}
	// Stripe 1's first unit: now dirty in every unit, it goes out at once.
	write(ss, U)
	if q, _, _ := queue(1); q != qUrgent {
		t.Fatalf("stripe 1 dirty in every unit: queue %d, want urgent (%d)", q, qUrgent)
	}
	writeBackNow(t, c)
	if c.Dirty(0, 4) {
		t.Fatal("dirty stripes left after the write-outs")
	}
	// Pressure: with 3 of 4 heads dirty (more than half), the oldest are offered at once until
	// no more than 3/8 of the cache (1 head) is queued.
	for s := range int64(3) {
		write(s*ss+U, U)
	}
	writeBackNow(t, c)
	if c.Dirty(0, 1) || c.Dirty(1, 1) || !c.Dirty(2, 1) {
		t.Errorf("dirty after the write-outs under pressure: %v %v %v, want stripes 0 and 1 written out, 2 waiting", c.Dirty(0, 1), c.Dirty(1, 1), c.Dirty(2, 1))
	}
	// With the write-out goroutines running and a short delay, an up-to-date head written in
	// one unit is written out without a Flush.
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	c.delay = time.Millisecond
	c.Start(t.Context())
	write(2*U, U)
	for deadline := time.Now().Add(30 * time.Second); c.Dirty(0, 4); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a stripe still dirty 30 s after its last write, with a 1 ms write-back delay")
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	check(t, l, mm, model)
}

// TestOneTimer: with heads queued but none due, one write-out goroutine waits for the next to
// fall due and the others wait to be kicked (one timer, not one per goroutine); once the
// waiting one is awake again another may take the timer; a head offered while another is
// due already wakes a second goroutine, and one offered while the rest are not due wakes none.
func TestOneTimer(t *testing.T) {
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	c, _, model := newTestCache(t, l, 8, 8, -1, 12)
	c.delay = time.Hour
	for s := range int64(3) {
		off := s * l.StripeSize()
		if _, err := c.Write(model[off:off+stripe.UnitSize], off, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	<-c.kick // the first queued head's kick
	now := time.Now()
	c.mu.Lock()
	c.heads[2].due = now.Add(10 * time.Hour) // still being written
	c.mu.Unlock()
	var a, b bool
	if _, ok, wait := c.next(now, &a); ok || wait <= 0 || !a {
		t.Fatalf("first goroutine: ok %v, wait %v, timer %v; want to wait for the first head", ok, wait, a)
	}
	if _, ok, wait := c.next(now, &b); ok || wait != -1 || b {
		t.Fatalf("second goroutine: ok %v, wait %v, timer %v; want to wait for a kick", ok, wait, b)
	}
	if _, _, wait := c.next(now, &a); wait <= 0 || !a { // woken, nothing due: the timer again
		t.Fatalf("first goroutine again: wait %v, timer %v; want the timer", wait, a)
	}
	late := now.Add(2 * time.Hour) // stripes 0 and 1 due, 2 not
	if s, ok, _ := c.next(late, &b); !ok || s != 0 || b || !c.timing {
		t.Fatalf("second goroutine when both are due: stripe %d, ok %v, timer %v; want stripe 0 and the first still timing", s, ok, b)
	}
	select {
	case <-c.kick:
	default:
		t.Fatal("stripe 1 due too, but no other goroutine kicked")
	}
	if s, ok, _ := c.next(late, &a); !ok || s != 1 || a || c.timing {
		t.Fatalf("first goroutine: stripe %d, ok %v, timer %v, timing %v; want stripe 1, nobody timing", s, ok, a, c.timing)
	}
	select {
	case <-c.kick:
		t.Fatal("kicked with nothing due: stripe 2 is still being written")
	default:
	}
}
