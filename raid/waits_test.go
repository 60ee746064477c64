package raid_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// meter counts the data-area writes in flight on a set of members and holds each until want
// of them are in flight together (or a generous timeout passes): members whose writes wait,
// as remote ones do, are only fast if the array keeps many of their writes in flight.
type meter struct {
	mu       sync.Mutex // guards the fields below
	want     int
	inflight int
	most     int           // the most writes seen in flight together
	full     chan struct{} // closed once want writes were in flight together
}

func newMeter(want int) *meter { return &meter{want: want, full: make(chan struct{})} }

func (mt *meter) enter() {
	mt.mu.Lock()
	mt.inflight++
	mt.most = max(mt.most, mt.inflight)
	if mt.inflight == mt.want {
		close(mt.full)
	}
	mt.mu.Unlock()
	select {
	case <-mt.full:
	case <-time.After(2 * time.Second): // serial writes never get there: each waits this long
	}
}

func (mt *meter) leave() {
	mt.mu.Lock()
	mt.inflight--
	mt.mu.Unlock()
}

func (mt *meter) max() int {
	mt.mu.Lock()
	defer mt.mu.Unlock()
	return mt.most
}

// waiter is an in-memory member that says its I/O waits (member.Waiter), whose data-area
// writes go through a meter.
type waiter struct {
	*raidtest.Mem
	mt *meter
}

func (w *waiter) Waits() bool { return true }

func (w *waiter) WriteAt(p []byte, off int64) (int, error) {
	if off >= raid.DataOffset {
		w.mt.enter()
		defer w.mt.leave()
	}
	return w.Mem.WriteAt(p, off)
}

// TestWaitingMembersConcurrent: on members that wait (remote ones), a write-out's member
// writes are in flight together, not one member after another (a small batch of writes to
// members that copy runs inline: two round trips instead of one), and many stripes are
// written out at once (more write-out goroutines and member I/O goroutines than for members
// that copy: the write-outs in flight bound the throughput of random writes).
func TestWaitingMembersConcurrent(t *testing.T) {
	const chunk = 64 << 10
	for _, tc := range []struct {
		name    string
		stripes int // partial stripes written, one 4 KiB write each, then flushed
		want    int // member writes in flight together
	}{
		{"one-stripe", 1, 2}, // its data and its parity
		{"many-stripes", 12, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := newMems("w", 4, raid.DataOffset+32*chunk)
			createClosed(t, ms, raid.CreateOptions{Chunk: chunk})
			mt := newMeter(tc.want)
			ws := make([]raid.Member, len(ms))
			for i, m := range ms {
				ws[i] = &waiter{Mem: m, mt: mt}
			}
			a, err := raid.AssembleMembers(ws, raid.AssembleOptions{IOOptions: raid.IOOptions{WriteBackDelay: never}})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			ss := a.Layout().StripeSize()
			want := bytes.Repeat([]byte{0x5a}, 4096)
			for s := range int64(tc.stripes) {
				if _, err := a.WriteAt(want, s*ss); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := mt.max(); got < tc.want {
				t.Errorf("at most %d member writes in flight together, want %d", got, tc.want)
			}
			got := make([]byte, 4096)
			for s := range int64(tc.stripes) {
				if _, err := a.ReadAt(got, s*ss); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("stripe %d reads back other bytes", s)
				}
			}
			if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
				t.Errorf("stripes with wrong parity: %v", bad)
			}
		})
	}
}
