package nbd

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

func dial(t *testing.T, path string) *rawClient {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return newRawClient(t, nc)
}

// serve runs s.Serve on ln in the background; the returned channel yields its result.
func serve(ctx context.Context, s *Server, ln net.Listener) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	return done
}

// noServerGoroutines fails if any goroutine of this package's server is still running.
func noServerGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "nbd.(*conn)") || strings.Contains(g, "nbd.(*Server).ServeConn") {
			t.Errorf("server goroutine still running:\n%s", g)
		}
	}
}

func TestServeClients(t *testing.T) {
	const clients, per = 4, 64 << 10
	mem := nbdtest.NewMemDevice(clients * per)
	s, _ := testServer(t, Options{Exports: []Export{{Name: "d", Device: mem}}})
	ln, path := unixListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serve(ctx, s, ln)

	model := make([]byte, clients*per)
	var wg sync.WaitGroup
	for i := range clients {
		p := pattern(uint64(i), per)
		copy(model[i*per:], p)
		c := dial(t, path)
		wg.Go(func() {
			c.handshakeGo("d")
			for j := 0; j < per; j += 4096 {
				if errno, _ := c.do(wire.CmdWrite, 0, uint64(i*per+j), 4096, p[j:j+4096]); errno != 0 {
					t.Errorf("client %d: WRITE errno %d", i, errno)
					return
				}
			}
			errno, got := c.do(wire.CmdRead, 0, uint64(i*per), per, nil)
			if errno != 0 || firstDiff(got, p) >= 0 {
				t.Errorf("client %d: read back errno %d, differs at %d", i, errno, firstDiff(got, p))
			}
			c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
			c.expectClosed()
		})
	}
	wg.Wait()
	checkDevice(t, mem, model)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v, want nil after cancel", err)
	}
	noServerGoroutines(t)
}

// TestServeShutdownDrains: cancelling Serve's context lets every request in flight finish and
// reply on every connection, closes them, and only then returns.
func TestServeShutdownDrains(t *testing.T) {
	const clients, writes, bs = 3, 4, 4096
	mem := nbdtest.NewMemDevice(clients * writes * bs)
	g := newGate()
	mem.Delay = g.hold
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}})
	ln, path := unixListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serve(ctx, s, ln)

	model := make([]byte, clients*writes*bs)
	var cs []*rawClient
	for i := range clients {
		c := dial(t, path)
		c.handshakeGo("")
		for j := range writes {
			k := i*writes + j
			p := pattern(uint64(k), bs)
			copy(model[k*bs:], p)
			c.request(wire.CmdWrite, 0, uint64(k), uint64(k*bs), bs, p)
		}
		cs = append(cs, c)
	}
	idle := dial(t, path) // a client still in the handshake
	idle.greet(wire.FlagCFixedNewstyle)
	g.waitFor(t, clients*writes)

	cancel()
	select {
	case err := <-done:
		t.Fatalf("Serve returned (%v) with writes in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	idle.expectClosed()
	close(g.open)
	for i, c := range cs {
		for range writes {
			errno, cookie := c.reply()
			if errno != 0 || int(cookie)/writes != i {
				t.Fatalf("client %d: reply errno %d cookie %d", i, errno, cookie)
			}
		}
		c.expectClosed()
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after draining")
	}
	checkDevice(t, mem, model)
	noServerGoroutines(t)
	if _, err := net.Dial("unix", path); err == nil {
		t.Error("listener still accepting after Serve returned")
	}
}

// failingListener accepts one connection, then fails for good once broke is closed.
type failingListener struct {
	net.Listener
	broke    chan struct{}
	mu       sync.Mutex // guards accepted
	accepted bool
}

var errListenerBroke = errors.New("listener broke")

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	first := !l.accepted
	l.accepted = true
	l.mu.Unlock()
	if first {
		return l.Listener.Accept()
	}
	<-l.broke
	return nil, errListenerBroke
}

// TestServeListenerFails: Serve returns the Accept error, after closing its connections.
func TestServeListenerFails(t *testing.T) {
	s, _ := testServer(t, Options{Exports: []Export{{Device: nbdtest.NewMemDevice(testSize)}}})
	ln, path := unixListener(t)
	fl := &failingListener{Listener: ln, broke: make(chan struct{})}
	done := serve(context.Background(), s, fl)
	c := dial(t, path)
	c.handshakeGo("")
	close(fl.broke)
	select {
	case err := <-done:
		if !errors.Is(err, errListenerBroke) {
			t.Fatalf("Serve = %v, want %v", err, errListenerBroke)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	c.expectClosed()
	noServerGoroutines(t)
}

// TestServeShutdownTimeout: a client that stops reading its replies cannot hold Serve past
// Options.ShutdownTimeout.
func TestServeShutdownTimeout(t *testing.T) {
	s, logs := testServer(t, Options{
		Exports:         []Export{{Device: nbdtest.NewMemDevice(8 << 20)}},
		ShutdownTimeout: 100 * time.Millisecond,
	})
	ln, path := unixListener(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := serve(ctx, s, ln)
	c := dial(t, path)
	c.handshakeGo("")
	for i := range 16 { // 16 MiB of replies: far more than the socket buffers hold
		c.request(wire.CmdRead, 0, uint64(i), uint64(i%8)<<20, 1<<20, nil)
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve = %v", err)
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Errorf("Serve returned after %v, before ShutdownTimeout", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve held by a client that does not read")
	}
	noServerGoroutines(t)
	if !logs.loggedErr(os.ErrDeadlineExceeded) {
		t.Error("the abandoned replies were not logged")
	}
}

func TestServeTCP(t *testing.T) {
	mem := nbdtest.NewMemDevice(testSize)
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := serve(ctx, s, ln)
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := newRawClient(t, nc)
	c.handshakeGo("")
	p := pattern(42, 8192)
	if errno, _ := c.do(wire.CmdWrite, wire.CmdFlagFUA, 4096, 8192, p); errno != 0 {
		t.Fatal(errno)
	}
	if errno, got := c.do(wire.CmdRead, 0, 4096, 8192, nil); errno != 0 || firstDiff(got, p) >= 0 {
		t.Fatalf("read back over TCP: errno %d, differs at %d", errno, firstDiff(got, p))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
}
