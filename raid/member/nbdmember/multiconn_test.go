package nbdmember_test

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/member/nbdmember"
)

// connCounts counts, per server-side connection, the WRITEs and FLUSHes it served.
type connCounts struct{ writes, flushes [64]atomic.Int64 }

// countingDevice is dev as one connection serves it, counting into its connCounts slot.
type countingDevice struct {
	*cacheDevice
	c *connCounts
	i int
}

func (d countingDevice) WriteAt(p []byte, off int64) (int, error) {
	d.c.writes[d.i].Add(1)
	return d.cacheDevice.WriteAt(p, off)
}

func (d countingDevice) Flush() error {
	d.c.flushes[d.i].Add(1)
	return d.cacheDevice.Flush()
}

func counted(dev *cacheDevice, c *connCounts) func(int) nbd.Device {
	return func(i int) nbd.Device { return countingDevice{dev, c, i} }
}

// barrier makes dev hold every READ and WRITE while armed until n of them are in the device
// at once (so that n requests are in flight together), or 10 s have passed.
func barrier(dev *nbdtest.MemDevice, n int64) (arm func()) {
	var armed atomic.Bool
	var arrived atomic.Int64
	var all chan struct{}
	var once *sync.Once
	dev.Delay = func(op nbdtest.Op, off, k int64) {
		if !armed.Load() {
			return
		}
		if arrived.Add(1) == n {
			once.Do(func() { armed.Store(false); close(all) })
		}
		select {
		case <-all:
		case <-time.After(10 * time.Second):
		}
	}
	return func() {
		arrived.Store(0)
		all, once = make(chan struct{}), new(sync.Once)
		armed.Store(true)
	}
}

// TestMultiConn: with Conns 4 and a server that advertises CAN_MULTI_CONN the member opens
// four connections; requests in flight together are spread over them (the least busy first),
// every byte lands where it belongs and reads back; Sync sends FLUSH on every connection; a
// restart reconnects all four; and a write acknowledged on one connection and lost by the
// restart fails the member, whichever connection the next request takes. A server that does
// not advertise CAN_MULTI_CONN gets one connection.
func TestMultiConn(t *testing.T) {
	dev := newCacheDevice(8 << 20)
	arm := barrier(dev.MemDevice, 8)
	var counts connCounts
	srv := newKillable(t, exportOf(t, counted(dev, &counts)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Conns: 4, Timeout: 30 * time.Second, Logger: quiet})
	trust(t, m)
	if n := nbdmember.Conns(m); n != 4 {
		t.Fatalf("%d connections, want 4", n)
	}
	data := random(8 << 20)
	const chunk = 64 << 10
	var bufs [][]byte
	for i := range 8 {
		bufs = append(bufs, data[i*chunk:(i+1)*chunk])
	}
	arm()
	var wg sync.WaitGroup
	for i, b := range bufs {
		wg.Go(func() {
			if n, err := m.WriteAt(b, int64(i*chunk)); n != chunk || err != nil {
				t.Errorf("WriteAt = %d, %v", n, err)
			}
		})
	}
	wg.Wait()
	for i := range 4 {
		if w := counts.writes[i].Load(); w != 2 {
			t.Errorf("connection %d served %d of the 8 WRITEs in flight together, want 2", i, w)
		}
	}
	// Many writers, then many readers, at once: every byte checked.
	for i := 8; i < len(data)/chunk; i++ {
		wg.Go(func() {
			if _, err := m.WriteAt(data[i*chunk:(i+1)*chunk], int64(i*chunk)); err != nil {
				t.Errorf("WriteAt %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if !bytes.Equal(dev.Bytes(), data) {
		t.Fatal("the device does not hold what was written over four connections")
	}
	got := make([]byte, len(data))
	for i := range len(data) / chunk {
		wg.Go(func() {
			if _, err := m.ReadAt(got[i*chunk:(i+1)*chunk], int64(i*chunk)); err != nil {
				t.Errorf("ReadAt %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if !bytes.Equal(got, data) {
		t.Fatal("read back over four connections differs")
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if f := counts.flushes[i].Load(); f != 1 {
			t.Errorf("connection %d served %d FLUSHes after one Sync, want 1", i, f)
		}
	}

	// A restart with everything flushed: four new connections, each flushed by Sync.
	restart(srv, dev)
	mustRead(t, m, data[:chunk], 0, "after the restart")
	if n, c := nbdmember.Reconnects(m), nbdmember.Conns(m); n != 1 || c != 4 {
		t.Errorf("after a restart: %d reconnects and %d connections, want 1 and 4", n, c)
	}
	mustWrite(t, m, data[:chunk], 0, "after the restart")
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := 4; i < 8; i++ {
		if f := counts.flushes[i].Load(); f != 1 {
			t.Errorf("connection %d (after the restart) served %d FLUSHes after one Sync, want 1", i, f)
		}
	}

	// A write acknowledged on one connection and lost: the member fails, for every request.
	mustWrite(t, m, data[chunk:2*chunk], chunk, "unflushed")
	restart(srv, dev)
	for range 4 {
		wg.Go(func() {
			if _, err := m.ReadAt(make([]byte, chunk), chunk); !errors.Is(err, nbdmember.ErrLostWrites) {
				t.Errorf("read after a restart lost a write: %v, want ErrLostWrites", err)
			}
		})
	}
	wg.Wait()

	defer nbdmember.MaskServerFlags(client.FlagCanMultiConn)()
	one := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Conns: 4, Logger: quiet})
	trust(t, one)
	if n := nbdmember.Conns(one); n != 1 {
		t.Errorf("%d connections to a server without CAN_MULTI_CONN, want 1", n)
	}
}
