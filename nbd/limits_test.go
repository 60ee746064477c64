package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/testpki"
	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// loggedLimit reports whether some record names the limit (its "limit" attribute).
func (l *logStore) loggedLimit(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		found := false
		r.Attrs(func(a slog.Attr) bool {
			found = a.Key == "limit" && a.Value.String() == name
			return !found
		})
		if found {
			return true
		}
	}
	return false
}

// roundTrip writes a pattern at off and reads it back, comparing every byte.
func (c *rawClient) roundTrip(seed, off uint64, n uint32) {
	c.t.Helper()
	c.roundTripData(off, pattern(seed, int(n)))
}

// roundTripData writes p at off and reads it back, failing the test unless every byte matches.
func (c *rawClient) roundTripData(off uint64, p []byte) {
	c.t.Helper()
	n := uint32(len(p))
	if errno, _ := c.do(wire.CmdWrite, 0, off, n, p); errno != 0 {
		c.t.Fatalf("WRITE at %d: errno %d", off, errno)
	}
	if errno, got := c.do(wire.CmdRead, 0, off, n, nil); errno != 0 || !bytes.Equal(got, p) {
		c.t.Fatalf("READ at %d: errno %d, data equal %v", off, errno, bytes.Equal(got, p))
	}
}

// optionAnswered sends option id with no data and reads its replies up to the final ACK. It
// reports false if the server closed the connection meanwhile; other errors fail the test.
func (c *rawClient) optionAnswered(id uint32) bool {
	c.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, wire.MagicOption)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, 0)
	if _, err := c.nc.Write(b); err != nil {
		return !c.closedByServer(err)
	}
	for {
		var h [20]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return !c.closedByServer(err)
		}
		if m := binary.BigEndian.Uint64(h[:]); m != wire.MagicOptionReply {
			c.t.Fatalf("option reply magic %#x", m)
		}
		if _, err := io.CopyN(io.Discard, c.r, int64(binary.BigEndian.Uint32(h[16:]))); err != nil {
			return !c.closedByServer(err)
		}
		if binary.BigEndian.Uint32(h[12:]) == wire.RepAck {
			return true
		}
	}
}

// closedByServer reports that err is what a client sees once the server has closed the
// connection (end of stream, reset, broken pipe), and fails the test on any other error.
func (c *rawClient) closedByServer(err error) bool {
	c.t.Helper()
	for _, closed := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, closed) {
			return true
		}
	}
	c.t.Fatalf("client I/O: %v, want the connection closed by the server", err)
	return false
}

// expectClosedWithin checks that the server closes the connection within d, and not before
// min; it returns when it did.
func (c *rawClient) expectClosedWithin(min, d time.Duration) {
	c.t.Helper()
	start := time.Now()
	c.nc.SetReadDeadline(start.Add(d))
	c.expectClosed()
	if el := time.Since(start); el < min {
		c.t.Errorf("closed after %v, want at least %v", el, min)
	}
}

func TestMaxConnections(t *testing.T) {
	mem := nbdtest.NewMemDevice(testSize)
	s, logs, path := serveUnix(t, Options{Exports: []Export{{Device: mem}}, MaxConnections: 2})
	good := dial(t, path)
	good.handshakeGo("")
	hog := dial(t, path)
	hog.greet(wire.FlagCFixedNewstyle) // the second connection, sitting in the handshake
	for i := range 3 {
		extra := dial(t, path)
		extra.expectClosed() // not even a greeting
		good.roundTrip(uint64(i), uint64(i)*65536, 65536)
	}
	if !logs.loggedErr(ErrTooManyConnections) || !logs.loggedLimit("MaxConnections") {
		t.Error("no log line with ErrTooManyConnections and limit=MaxConnections")
	}
	if n := s.conns.Load(); n != 2 {
		t.Errorf("%d connections counted, want 2", n)
	}
	// Once the hog leaves, a new client is served.
	hog.nc.Close()
	for deadline := time.Now().Add(10 * time.Second); s.conns.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections counted after the hog left, want 1", s.conns.Load())
		}
	}
	next := dial(t, path)
	next.handshakeGo("")
	next.roundTrip(9, 1<<19, 4096)
	good.roundTrip(10, 0, 4096)
}

func TestHandshakeTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	pki := testpki.New(t)
	mem := nbdtest.NewMemDevice(testSize)
	_, logs, path := serveUnix(t, Options{Exports: []Export{{Device: mem}}, HandshakeTimeout: timeout,
		TLSConfig: serverConfig(t, pki, false), TLSMode: TLSOn})
	good := dial(t, path)
	good.handshakeGo("")

	for _, tt := range []struct {
		name string
		send func(c *rawClient)
	}{
		{"silent", func(c *rawClient) { c.read(18) }},
		{"flags only", func(c *rawClient) { c.greet(wire.FlagCFixedNewstyle) }},
		{"half an option", func(c *rawClient) {
			c.greet(wire.FlagCFixedNewstyle)
			c.write(binary.BigEndian.AppendUint64(nil, wire.MagicOption))
		}},
		{"options forever", func(c *rawClient) {
			// Each option is answered, but the handshake as a whole has a deadline, not each
			// option: the client haggles, timeout/20 apart, until the server closes, which
			// must be at the deadline (not before: checked below) plus a bound for a loaded
			// machine. How many options fit before it is up to the scheduler (3 options
			// timeout/4 apart were cut off in 5 of 200 runs at load 23).
			c.greet(wire.FlagCFixedNewstyle)
			for start := time.Now(); c.optionAnswered(wire.OptList); time.Sleep(timeout / 20) {
				if time.Since(start) > timeout+5*time.Second {
					c.t.Fatalf("options answered for %v past a handshake timeout of %v", time.Since(start), timeout)
				}
			}
		}},
		{"STARTTLS then silence", func(c *rawClient) {
			c.greet(wire.FlagCFixedNewstyle)
			c.option(wire.OptStartTLS, nil)
			if r := c.optionReply(); r.typ != wire.RepAck {
				c.t.Fatalf("STARTTLS: %#x", r.typ)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now() // before the dial: the server's clock starts once it accepts
			c := dial(t, path)
			tt.send(c)
			c.expectClosedWithin(timeout-time.Since(start)-10*time.Millisecond, 10*time.Second)
			good.roundTrip(1, 0, 65536) // past the handshake: no deadline
		})
	}
	if !logs.loggedErr(ErrHandshakeTimeout) || !logs.loggedLimit("HandshakeTimeout") {
		t.Error("no log line with ErrHandshakeTimeout and limit=HandshakeTimeout")
	}
	// A client over TLS that finishes in time keeps its connection past the timeout. In time
	// is 2 s here: a TLS handshake on a loaded machine can take longer than 200 ms (1 of 200
	// runs at load 28 was closed during it).
	const tlsTimeout = 2 * time.Second
	_, _, path = serveUnix(t, Options{Exports: []Export{{Device: mem}}, HandshakeTimeout: tlsTimeout,
		TLSConfig: serverConfig(t, pki, false), TLSMode: TLSOn})
	c := dial(t, path)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := c.startTLS(pki.ClientConfig(nil)); err != nil {
		t.Fatal(err)
	}
	c.handshakeGoAfterGreet("")
	time.Sleep(tlsTimeout + 50*time.Millisecond)
	c.roundTrip(2, 65536, 4096)
}

// TestIdleTimeout: a connection with nothing in flight and no request for IdleTimeout is
// closed (and logged), not before; one that keeps talking, or waits for a slow reply, is not.
// The talking client sends every idle/10: the server only sees a request once its reader has
// run, so the margin must cover the scheduling pauses of a loaded machine (with idle/3 of
// 300 ms, a 200 ms stall closed it: 1 of 30 runs at load 5).
func TestIdleTimeout(t *testing.T) {
	const idle = time.Second
	slow := nbdtest.NewMemDevice(testSize)
	slow.Delay = func(op nbdtest.Op, _, _ int64) {
		if op == nbdtest.OpWrite {
			time.Sleep(2 * idle)
		}
	}
	_, logs, path := serveUnix(t, Options{IdleTimeout: idle, Exports: []Export{
		{Name: "fast", Device: nbdtest.NewMemDevice(testSize)},
		{Name: "slow", Device: slow},
	}})
	var wg sync.WaitGroup
	wg.Go(func() { // a client that keeps talking is never idle
		c := dial(t, path)
		c.handshakeGo("fast")
		for i := range 15 { // for longer than idle
			c.roundTrip(uint64(i), uint64(i)*4096, 4096)
			time.Sleep(idle / 10)
		}
	})
	wg.Go(func() { // nor one waiting for a reply longer than the idle timeout
		c := dial(t, path)
		c.handshakeGo("slow")
		p := pattern(7, 4096)
		if errno, _ := c.do(wire.CmdWrite, 0, 0, 4096, p); errno != 0 {
			t.Errorf("slow WRITE: errno %d", errno)
		}
		c.expectClosedWithin(idle-50*time.Millisecond, 10*time.Second) // then idle: closed
		if !bytes.Equal(slow.Bytes()[:4096], p) {
			t.Error("slow write lost")
		}
	})
	c := dial(t, path)
	c.handshakeGo("fast")
	c.roundTrip(1, 1<<19, 4096)
	c.expectClosedWithin(idle-50*time.Millisecond, 10*time.Second)
	wg.Wait()
	if !logs.loggedErr(ErrIdleTimeout) || !logs.loggedLimit("IdleTimeout") {
		t.Error("no log line with ErrIdleTimeout and limit=IdleTimeout")
	}
}

// TestMaxTotalInFlightBytes: two connections pipeline 16 KiB writes and reads against a slow
// device; with room for four such requests server-wide, the device never sees more than four
// at once, though each connection alone may have 64 MiB in flight. Every byte comes back.
func TestMaxTotalInFlightBytes(t *testing.T) {
	const conns, n, bs = 2, 16, 16 << 10
	mem := nbdtest.NewMemDevice(conns * n * bs)
	mem.Delay = func(nbdtest.Op, int64, int64) { time.Sleep(2 * time.Millisecond) }
	s, logs, path := serveUnix(t, Options{Exports: []Export{{Device: mem}}, MaxTotalInFlightBytes: 4 * bs})
	var wg sync.WaitGroup
	for i := range conns {
		c := dial(t, path)
		c.handshakeGo("")
		wg.Go(func() {
			base := uint64(i * n * bs)
			for _, typ := range []uint16{wire.CmdWrite, wire.CmdRead} {
				go func() {
					for k := range n {
						var p []byte
						if typ == wire.CmdWrite {
							p = pattern(base+uint64(k), bs)
						}
						c.request(typ, 0, uint64(k), base+uint64(k*bs), bs, p)
					}
				}()
				for range n {
					errno, cookie := c.reply()
					if errno != 0 {
						t.Errorf("conn %d: errno %d", i, errno)
						return
					}
					if typ == wire.CmdRead {
						if got := c.read(bs); !bytes.Equal(got, pattern(base+cookie, bs)) {
							t.Errorf("conn %d: block %d differs", i, cookie)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if st := mem.Stats(); st.MaxConcurrent > 4 || st.MaxConcurrent < 2 {
		t.Errorf("device saw %d requests at once, want 2..4 (MaxTotalInFlightBytes)", st.MaxConcurrent)
	}
	if !logs.loggedLimit("MaxTotalInFlightBytes") {
		t.Error("no log line with limit=MaxTotalInFlightBytes")
	}
	for deadline := time.Now().Add(10 * time.Second); s.mem.used.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still charged server-wide", s.mem.used.Load())
		}
	}
}

// queuedTake starts h's take of n bytes in the background and waits until it is queued; the
// channel yields take's result once it is granted.
func queuedTake(t *testing.T, b *budget, h *holder, n int64, mid bool) <-chan bool {
	t.Helper()
	got := make(chan bool, 1)
	go func() { got <- b.take(h, n, mid) }()
	for deadline := time.Now().Add(10 * time.Second); !b.isWaiting(h); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a take of %d bytes never queued", n)
		}
	}
	return got
}

// isWaiting reports whether h has a take queued. grant runs within give and endPayload, so
// right after them this says whether it was granted.
func (b *budget) isWaiting(h *holder) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return h.waiting
}

func granted(t *testing.T, got <-chan bool) {
	t.Helper()
	select {
	case waited := <-got:
		if !waited {
			t.Error("a queued take reported that it did not wait")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a granted take did not return")
	}
}

// takeNow reports whether h's take of n bytes is granted without queueing; if it queues, it
// is left to finish in the background.
func takeNow(b *budget, h *holder, n int64, mid bool) bool {
	got := make(chan bool, 1)
	go func() { got <- b.take(h, n, mid) }()
	select {
	case waited := <-got:
		return !waited
	case <-time.After(10 * time.Second):
		return false
	}
}

func newBudget(max int64, conns int) *budget {
	b := &budget{max: max}
	for range conns {
		b.join()
	}
	return b
}

// TestBudget: take admits what fits, or anything when nothing is taken, and waits otherwise
// until give makes room.
func TestBudget(t *testing.T) {
	b := newBudget(100, 2)
	h1, h2 := newHolder(), newHolder()
	if b.take(h1, 300, false) || b.used.Load() != 300 {
		t.Fatal("an oversized take on an empty budget should pass at once")
	}
	got := queuedTake(t, b, h2, 50, false)
	b.give(h1, 300)
	granted(t, got)
	if b.take(h2, 50, false) || b.used.Load() != 100 || h2.held.Load() != 100 || h1.held.Load() != 0 {
		t.Fatalf("used %d, held %d and %d; want 100, 0 and 100", b.used.Load(), h1.held.Load(), h2.held.Load())
	}
}

// TestBudgetShares: while takes wait, a connection under its share (max / connections) goes
// before one over it, even one that came first; one under its share that does not fit holds
// up those behind it, so large requests are not starved by small ones.
func TestBudgetShares(t *testing.T) {
	b := newBudget(100, 2) // shares of 50
	hog, fair := newHolder(), newHolder()
	b.take(hog, 90, false)
	hogMore := queuedTake(t, b, hog, 20, false)
	fairGot := queuedTake(t, b, fair, 20, false)
	b.give(hog, 20) // room for one of them: the one under its share
	if b.isWaiting(fair) || !b.isWaiting(hog) {
		t.Fatalf("after room for one: fair waiting %v, hog waiting %v; want the fair one served", b.isWaiting(fair), b.isWaiting(hog))
	}
	granted(t, fairGot)
	b.give(fair, 20)
	granted(t, hogMore)

	// A large request under its share waits for room; a small one behind it waits too.
	big, small := newHolder(), newHolder()
	b.join()
	b.join() // four connections: shares of 25
	// used: hog 90 of 100
	bigGot := queuedTake(t, b, big, 20, false)
	smallGot := queuedTake(t, b, small, 5, false) // would fit, but does not pass big
	if !b.isWaiting(small) {
		t.Fatal("a small take passed a larger one under its share that waits")
	}
	b.give(hog, 30)
	granted(t, bigGot)
	granted(t, smallGot)
	if u := b.used.Load(); u != 85 {
		t.Errorf("used %d, want 85", u)
	}
}

// TestBudgetLane: a payload being received waits for no one while the lane is free: it passes
// the bound, one at a time, until endPayload; the next one gets the lane once the budget is
// back within its bound; requests waiting for a header never get it.
func TestBudgetLane(t *testing.T) {
	b := newBudget(100, 3)
	full, hdr, p1, p2 := newHolder(), newHolder(), newHolder(), newHolder()
	b.take(full, 100, false)
	hdrGot := queuedTake(t, b, hdr, 10, false)
	if !takeNow(b, p1, 30, true) || !p1.lane || b.used.Load() != 130 {
		t.Fatalf("a payload on a full budget: lane %v, used %d; want it admitted at once, the lane and 130", p1.lane, b.used.Load())
	}
	p2Got := queuedTake(t, b, p2, 30, true)
	if !takeNow(b, p1, 30, true) { // the lane holder's next piece
		t.Fatal("the lane holder's next piece waited")
	}
	if !b.isWaiting(p2) || !b.isWaiting(hdr) || b.used.Load() != 160 {
		t.Fatalf("with the lane taken: p2 waiting %v, header waiting %v, used %d", b.isWaiting(p2), b.isWaiting(hdr), b.used.Load())
	}
	b.endPayload(p1)
	if !b.isWaiting(p2) {
		t.Fatal("the lane was taken again while the last lane payload's bytes were still past the bound")
	}
	b.give(p1, 60) // its request is done: back within the bound
	granted(t, p2Got)
	if !p2.lane || !b.isWaiting(hdr) || b.used.Load() != 130 {
		t.Fatalf("after the lane came back: p2 lane %v, header waiting %v, used %d", p2.lane, b.isWaiting(hdr), b.used.Load())
	}
	b.endPayload(p2)
	b.give(p2, 30)
	b.give(full, 100)
	granted(t, hdrGot)
	if u := b.used.Load(); u != 10 {
		t.Errorf("used %d, want 10", u)
	}
}
