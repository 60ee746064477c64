package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"sync"
	"testing"
	"time"

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

// serveLimits serves opts on a unix socket until the test ends.
func serveLimits(t *testing.T, opts Options) (*Server, *logStore, string) {
	t.Helper()
	s, logs := testServer(t, opts)
	ln, path := unixListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serve(ctx, s, ln)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, logs, path
}

// roundTrip writes a pattern at off and reads it back, comparing every byte.
func (c *rawClient) roundTrip(seed, off uint64, n uint32) {
	c.t.Helper()
	p := pattern(seed, int(n))
	if errno, _ := c.do(cmdWrite, 0, off, n, p); errno != 0 {
		c.t.Fatalf("WRITE at %d: errno %d", off, errno)
	}
	if errno, got := c.do(cmdRead, 0, off, n, nil); errno != 0 || !bytes.Equal(got, p) {
		c.t.Fatalf("READ at %d: errno %d, data equal %v", off, errno, bytes.Equal(got, p))
	}
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
	s, logs, path := serveLimits(t, Options{Exports: []Export{{Device: mem}}, MaxConnections: 2})
	good := dial(t, path)
	good.handshakeGo("")
	hog := dial(t, path)
	hog.greet(clientFixedNewstyle) // the second connection, sitting in the handshake
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
	pki := newTestPKI(t)
	mem := nbdtest.NewMemDevice(testSize)
	_, logs, path := serveLimits(t, Options{Exports: []Export{{Device: mem}}, HandshakeTimeout: timeout,
		TLSConfig: pki.serverConfig(t, false), TLSMode: TLSOn})
	good := dial(t, path)
	good.handshakeGo("")

	for _, tt := range []struct {
		name string
		send func(c *rawClient)
	}{
		{"silent", func(c *rawClient) { c.read(18) }},
		{"flags only", func(c *rawClient) { c.greet(clientFixedNewstyle) }},
		{"half an option", func(c *rawClient) {
			c.greet(clientFixedNewstyle)
			c.write(binary.BigEndian.AppendUint64(nil, magicOption))
		}},
		{"options forever", func(c *rawClient) {
			c.greet(clientFixedNewstyle)
			for range 3 { // each answered, but the handshake as a whole has a deadline
				c.option(optList, nil)
				for c.optionReply().typ != repAck {
				}
				time.Sleep(timeout / 4)
			}
		}},
		{"STARTTLS then silence", func(c *rawClient) {
			c.greet(clientFixedNewstyle)
			c.option(optStartTLS, nil)
			if r := c.optionReply(); r.typ != repAck {
				t.Fatalf("STARTTLS: %#x", r.typ)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, path)
			start := time.Now()
			tt.send(c)
			c.expectClosedWithin(timeout-time.Since(start)-10*time.Millisecond, 10*time.Second)
			good.roundTrip(1, 0, 65536) // past the handshake: no deadline
		})
	}
	if !logs.loggedErr(ErrHandshakeTimeout) || !logs.loggedLimit("HandshakeTimeout") {
		t.Error("no log line with ErrHandshakeTimeout and limit=HandshakeTimeout")
	}
	// A client over TLS that finishes in time keeps its connection past the timeout.
	c := dial(t, path)
	c.greet(clientFixedNewstyle | clientNoZeroes)
	if err := c.startTLS(pki.clientConfig(nil)); err != nil {
		t.Fatal(err)
	}
	c.handshakeGoAfterGreet("")
	time.Sleep(timeout + 50*time.Millisecond)
	c.roundTrip(2, 65536, 4096)
}

func TestIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	slow := nbdtest.NewMemDevice(testSize)
	slow.Delay = func(op nbdtest.Op, _, _ int64) {
		if op == nbdtest.OpWrite {
			time.Sleep(2 * idle)
		}
	}
	_, logs, path := serveLimits(t, Options{IdleTimeout: idle, Exports: []Export{
		{Name: "fast", Device: nbdtest.NewMemDevice(testSize)},
		{Name: "slow", Device: slow},
	}})
	var wg sync.WaitGroup
	wg.Go(func() { // a client that keeps talking is never idle
		c := dial(t, path)
		c.handshakeGo("fast")
		for i := range 10 {
			c.roundTrip(uint64(i), uint64(i)*4096, 4096)
			time.Sleep(idle / 3)
		}
	})
	wg.Go(func() { // nor one waiting for a reply longer than the idle timeout
		c := dial(t, path)
		c.handshakeGo("slow")
		p := pattern(7, 4096)
		if errno, _ := c.do(cmdWrite, 0, 0, 4096, p); errno != 0 {
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
	s, logs, path := serveLimits(t, Options{Exports: []Export{{Device: mem}}, MaxTotalInFlightBytes: 4 * bs})
	var wg sync.WaitGroup
	for i := range conns {
		c := dial(t, path)
		c.handshakeGo("")
		wg.Go(func() {
			base := uint64(i * n * bs)
			for _, typ := range []uint16{cmdWrite, cmdRead} {
				go func() {
					for k := range n {
						var p []byte
						if typ == cmdWrite {
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
					if typ == cmdRead {
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

// TestBudget: take admits what fits, or anything when nothing is taken, and waits otherwise
// until give makes room.
func TestBudget(t *testing.T) {
	b := &budget{max: 100}
	b.cond.L = &b.mu
	if b.take(300) || b.used.Load() != 300 {
		t.Fatal("an oversized take on an empty budget should pass at once")
	}
	got := make(chan bool)
	go func() { got <- b.take(50) }()
	select {
	case <-got:
		t.Fatal("take passed over the limit")
	case <-time.After(20 * time.Millisecond):
	}
	b.give(300)
	if waited := <-got; !waited || b.used.Load() != 50 {
		t.Fatalf("waited %v, used %d; want true, 50", waited, b.used.Load())
	}
	if b.take(50) || b.used.Load() != 100 {
		t.Fatal("a take that fits should pass at once")
	}
}
