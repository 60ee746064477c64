package nbd_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// cachedDevice is an in-memory nbd.Device that is also an nbd.CachedWriter and an
// nbd.PinnedWriter: it takes the writes of whole 4 KiB blocks at even block numbers, declines
// the rest, and counts both; it copies, and releases a pinned buffer at once.
type cachedDevice struct {
	*nbdtest.MemDevice
	cached   atomic.Int64
	declined atomic.Int64
	pinned   atomic.Int64 // WritePinned and WriteCached calls with a release
}

func (d *cachedDevice) WriteCached(p []byte, off int64, release func()) bool {
	if off%(4<<10) != 0 || len(p)%(4<<10) != 0 || off/(4<<10)%2 != 0 {
		d.declined.Add(1)
		return false
	}
	d.cached.Add(1)
	d.WritePinned(p, off, release)
	return true
}

func (d *cachedDevice) WritePinned(p []byte, off int64, release func()) (int, error) {
	n, err := d.WriteAt(p, off)
	if release != nil {
		d.pinned.Add(1)
		release()
	}
	return n, err
}

// TestCachedWrites: WRITEs the device takes from the reader's buffer (WriteCached) and those it
// declines (written as usual) are all stored, and read back byte for byte by a pipelined
// client with many requests in flight; the replies the reader holds back to send together
// never hold up the connection, even at an in-flight bound of one request.
func TestCachedWrites(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight int
		stable   bool
	}{{"default", 0, false}, {"inflight-1", 1, false}, {"inflight-3", 3, false}, {"stable-pages", 0, true}, {"stable-pages-inflight-1", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 8 << 20
			dev := &cachedDevice{MemDevice: nbdtest.NewMemDevice(size)}
			s, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "", Device: dev, StablePages: tc.stable}},
				MaxInFlightRequests: tc.inFlight})
			if err != nil {
				t.Fatal(err)
			}
			c, err := client.Dial(context.Background(), "nbd://"+nbdtest.ServeTCP(t, s), client.Options{MaxInFlight: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			writeEightAndCompare(t, c, size, 4<<10, 3, 300, 5)
			if dev.cached.Load() == 0 || dev.declined.Load() == 0 {
				t.Fatalf("%d WRITEs cached, %d declined: want both", dev.cached.Load(), dev.declined.Load())
			}
			if all := dev.cached.Load() + dev.declined.Load(); tc.stable && dev.pinned.Load() != all {
				t.Fatalf("%d of %d WRITEs pinned under stable pages", dev.pinned.Load(), all)
			}
		})
	}
}
