package client

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// gateConn holds the first Write after arm until release: a write in progress.
type gateConn struct {
	net.Conn
	mu      sync.Mutex
	hold    chan struct{} // armed: the next Write waits for it to close
	entered chan struct{} // closed when that Write has begun
}

// arm makes the next Write wait for hold to be closed; entered is closed once it has begun.
func (g *gateConn) arm() (hold, entered chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hold, g.entered = make(chan struct{}), make(chan struct{})
	return g.hold, g.entered
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	hold, entered := g.hold, g.entered
	g.hold = nil
	g.mu.Unlock()
	if hold != nil {
		close(entered)
		<-hold
	}
	return g.Conn.Write(p)
}

// TestBatchWhileWriting: the requests queued while a batch is being written go out together
// in the next one, and Counters count the batches, the requests and the replies.
func TestBatchWhileWriting(t *testing.T) {
	srv, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "a", Device: nbdtest.NewMemDevice(1 << 20)}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("unix", nbdtest.ServeUnix(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	gc := &gateConn{Conn: nc}
	var ctr Counters
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewConn(ctx, gc, "a", Options{Counters: &ctr})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	defer c.Close()

	const n = 10
	hold, entered := gc.arm()
	released := false
	defer func() {
		if !released {
			close(hold) // let the writer go, or Close waits for it
		}
	}()
	var wg sync.WaitGroup
	read := func(i int) {
		defer wg.Done()
		if _, err := c.ReadAt(make([]byte, 4096), int64(i)*4096); err != nil {
			t.Errorf("read %d: %v", i, err)
		}
	}
	wg.Add(1)
	go read(0)
	<-entered // the first batch is being written
	wg.Add(n)
	for i := 1; i <= n; i++ {
		go read(i)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.wmu.Lock()
		queued := len(c.wq)
		c.wmu.Unlock()
		if queued == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests queued", queued, n)
		}
	}
	close(hold)
	released = true
	wg.Wait()
	if b, r := ctr.WriteBatches.Load(), ctr.RequestsWritten.Load(); b != 2 || r != n+1 {
		t.Errorf("%d requests in %d batches, want %d in 2 (the first, and the %d queued meanwhile)", r, b, n+1, n)
	}
	if r := ctr.Replies.Load(); r != n+1 {
		t.Errorf("%d replies counted, want %d", r, n+1)
	}
}
