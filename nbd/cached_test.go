package nbd_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// cachedDevice is an in-memory nbd.Device that is also an nbd.CachedWriter: it takes the
// writes of whole 4 KiB blocks at even block numbers, declines the rest, and counts both.
type cachedDevice struct {
	*nbdtest.MemDevice
	cached   atomic.Int64
	declined atomic.Int64
}

func (d *cachedDevice) WriteCached(p []byte, off int64) bool {
	if off%(4<<10) != 0 || len(p)%(4<<10) != 0 || off/(4<<10)%2 != 0 {
		d.declined.Add(1)
		return false
	}
	if _, err := d.WriteAt(p, off); err != nil {
		panic(err)
	}
	d.cached.Add(1)
	return true
}

// TestCachedWrites: WRITEs the device takes from the reader's buffer (WriteCached) and those it
// declines (written as usual) are all stored, and read back byte for byte by a pipelined
// client with many requests in flight; the replies the reader holds back to send together
// never hold up the connection, even at an in-flight bound of one request.
func TestCachedWrites(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight int
	}{{"default", 0}, {"inflight-1", 1}, {"inflight-3", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 8 << 20
			dev := &cachedDevice{MemDevice: nbdtest.NewMemDevice(size)}
			s, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "", Device: dev}},
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
		})
	}
}
