package nbd_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// placedDevice is an in-memory nbd.Device that is also an nbd.PlacedWriter: it places every
// write of whole 64 KiB blocks, as two slices of its memory, and counts the placements.
type placedDevice struct {
	mem     []byte
	mu      sync.Mutex // guards mem; held from PlaceWrite to CommitPlaced, as a stripe lock would be
	placed  atomic.Int64
	partial atomic.Int64
}

func (d *placedDevice) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(p, d.mem[off:]), nil
}

func (d *placedDevice) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(d.mem[off:], p), nil
}

func (d *placedDevice) Size() (int64, error)         { return int64(len(d.mem)), nil }
func (d *placedDevice) Flush() error                 { return nil }
func (d *placedDevice) Trim(off, length int64) error { return nil }
func (d *placedDevice) WriteZeroes(off, length int64, _ bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.mem[off : off+length])
	return nil
}

func (d *placedDevice) PlaceUnit() int64 { return 64 << 10 }

func (d *placedDevice) PlaceWrite(off int64, n int, v [][]byte) ([][]byte, any, bool) {
	if off%(64<<10) != 0 || n%(64<<10) != 0 {
		return v, nil, false
	}
	d.mu.Lock()
	h := off + int64(n)/2
	return append(v, d.mem[off:h], d.mem[h:off+int64(n)]), n, true
}

func (d *placedDevice) CommitPlaced(h any, received int, _ bool) error {
	if received == h.(int) {
		d.placed.Add(1)
	} else {
		d.partial.Add(1)
	}
	d.mu.Unlock()
	return nil
}

// TestPlacedWrites: over TCP and a unix socket, WRITEs the device places are stored through
// its slices and read back byte for byte by a pipelined client (many requests in flight, so
// payloads often wait in the socket, and some requests are not placed: unaligned, or not yet
// arrived); the replies held back to go out together never hold up the connection, even at
// an in-flight bound of one request.
func TestPlacedWrites(t *testing.T) {
	for _, tc := range []struct {
		name     string
		serve    func(testing.TB, nbdtest.Server) string
		uri      func(string) string
		inFlight int // the server's MaxInFlightRequests: held replies count, and must never block it
	}{
		{"tcp", nbdtest.ServeTCP, func(a string) string { return "nbd://" + a }, 0},
		{"unix", nbdtest.ServeUnix, func(p string) string { return "nbd+unix:///?socket=" + p }, 0},
		{"unix-inflight-1", nbdtest.ServeUnix, func(p string) string { return "nbd+unix:///?socket=" + p }, 1},
		{"unix-inflight-3", nbdtest.ServeUnix, func(p string) string { return "nbd+unix:///?socket=" + p }, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 8 << 20
			dev := &placedDevice{mem: make([]byte, size)}
			s, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "", Device: dev}},
				MaxInFlightRequests: tc.inFlight})
			if err != nil {
				t.Fatal(err)
			}
			c, err := client.Dial(context.Background(), tc.uri(tc.serve(t, s)), client.Options{MaxInFlight: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			writeEightAndCompare(t, c, size, 64<<10, 4, 40, 3)
			if dev.placed.Load() == 0 {
				t.Fatal("no WRITE was placed")
			}
			if dev.partial.Load() != 0 {
				t.Fatalf("%d placed writes were cut short on a healthy connection", dev.partial.Load())
			}
		})
	}
}

// writeEightAndCompare runs eight writers on c, each in its own MiB of a device of size bytes
// (so that their writes are concurrent and the model needs no order between them), each
// writing count times 1 to most units of unit bytes at a random unit, a quarter of them
// shifted by 512 bytes (not aligned); then it reads the whole device back and compares it
// with the model.
func writeEightAndCompare(t *testing.T, c *client.Conn, size int, unit, most int64, count int, seed uint64) {
	t.Helper()
	model := make([]byte, size)
	var wg sync.WaitGroup
	for w := range int64(8) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for range count {
				n := unit * (1 + rng.Int64N(most))
				off := w<<20 + rng.Int64N((1<<20-n)/unit+1)*unit
				if rng.IntN(4) == 0 && off+n+512 <= (w+1)<<20 {
					off += 512
				}
				p := model[off : off+n]
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				if _, err := c.WriteAt(p, off); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := make([]byte, size)
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("device differs from the model")
	}
}
