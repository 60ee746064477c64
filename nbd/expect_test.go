package nbd_test

import (
	"context"
	"sync"
	"testing"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// expectDevice is an in-memory nbd.Device that is also an nbd.WriteExpecter and an
// nbd.CachedWriter (it takes every other 4 KiB-aligned write from the reader): it counts the
// ranges announced and not yet written, and each write, cached or not, notes whether its
// range had been announced.
type expectDevice struct {
	*nbdtest.MemDevice
	mu         sync.Mutex
	announced  map[[2]int64]int
	writes     int
	unexpected int
}

func (d *expectDevice) ExpectWrite(off, n int64) {
	d.mu.Lock()
	d.announced[[2]int64{off, n}]++
	d.mu.Unlock()
}

func (d *expectDevice) arrive(p []byte, off int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes++
	k := [2]int64{off, int64(len(p))}
	if d.announced[k] == 0 {
		d.unexpected++
		return
	}
	d.announced[k]--
}

func (d *expectDevice) WriteAt(p []byte, off int64) (int, error) {
	d.arrive(p, off)
	return d.MemDevice.WriteAt(p, off)
}

func (d *expectDevice) WriteCached(p []byte, off int64, release func()) bool {
	if off%(8<<10) != 0 || len(p)%(4<<10) != 0 {
		return false
	}
	d.arrive(p, off)
	if _, err := d.MemDevice.WriteAt(p, off); err != nil {
		panic(err)
	}
	if release != nil {
		release()
	}
	return true
}

// TestExpectWrite: the server announces every WRITE to a WriteExpecter with its range before
// the device writes it (from the reader: from a worker, or taken by WriteCached), with many
// requests in flight and at an in-flight bound of one; the data reads back byte for byte.
func TestExpectWrite(t *testing.T) {
	for _, inFlight := range []int{0, 1} {
		const size = 8 << 20
		dev := &expectDevice{MemDevice: nbdtest.NewMemDevice(size), announced: map[[2]int64]int{}}
		s, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "", Device: dev}}, MaxInFlightRequests: inFlight})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.Dial(context.Background(), "nbd://"+nbdtest.ServeTCP(t, s), client.Options{MaxInFlight: 16})
		if err != nil {
			t.Fatal(err)
		}
		writeEightAndCompare(t, c, size, 4<<10, 40, 100, 9)
		c.Close()
		dev.mu.Lock()
		if dev.writes == 0 || dev.unexpected != 0 {
			t.Errorf("in flight %d: %d of %d writes not announced before they were written", inFlight, dev.unexpected, dev.writes)
		}
		dev.mu.Unlock()
	}
}
