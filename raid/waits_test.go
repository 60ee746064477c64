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
	hold     time.Duration // how long a write waits for want at most
	inflight int
	most     int // the most writes seen in flight together
	reached  bool
	full     chan struct{} // closed once want writes were in flight together (reached)
}

func newMeter(want int, hold time.Duration) *meter {
	return &meter{want: want, hold: hold, full: make(chan struct{})}
}

func (mt *meter) enter() {
	mt.mu.Lock()
	mt.inflight++
	mt.most = max(mt.most, mt.inflight)
	if mt.inflight == mt.want && !mt.reached {
		mt.reached = true
		close(mt.full)
	}
	mt.mu.Unlock()
	select {
	case <-mt.full:
	case <-time.After(mt.hold): // serial writes never get there: each waits this long
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

// metered is a member whose data-area writes go through a meter.
type metered struct {
	raid.Member
	mt *meter
}

func (m *metered) WriteAt(p []byte, off int64) (int, error) {
	if off >= raid.DataOffset {
		m.mt.enter()
		defer m.mt.leave()
	}
	return m.Member.WriteAt(p, off)
}

// waiter is a metered member that says its I/O waits (member.Waiter), as a remote one does.
type waiter struct{ metered }

func (w *waiter) Waits() bool { return true }

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
			mt := newMeter(tc.want, 2*time.Second)
			ws := make([]raid.Member, len(ms))
			for i, m := range ms {
				ws[i] = &waiter{metered{Member: m, mt: mt}}
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

// TestReAddConcurrent: a re-add resyncs several of the bitmap's regions at once, also when
// they lie batches apart (each is a read of the survivors and a write of the member: round
// trips on a remote member), only those, and the stripes' parity matches their data after it.
// In "aliased", the clean stretches between the first four regions and the last two hold
// three pieces that share stripe locks with the first four (1024 stripes on) and so wait
// for their resyncs: the last two are resynced together with the first four all the same
// (when clean pieces took the same goroutines as the resyncs, three waited so and the sixth
// region waited for the first four: at most 5 in flight).
func TestReAddConcurrent(t *testing.T) {
	for _, tc := range []struct {
		name    string
		regions []int64 // the stripes written while the member was away, a region each
		want    int     // the re-added member's writes in flight together
	}{
		{"apart", []int64{0, 600, 1200, 1800, 2400, 3000, 3600}, 4}, // 9 batches apart
		{"aliased", []int64{0, 2, 4, 6, 3500, 3502}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, ms := windowArray(t, "r")
			ss := a.Layout().StripeSize()
			want := bytes.Repeat([]byte{0xa5}, int(ss))
			for _, s := range tc.regions {
				if _, err := a.WriteAt(want, s*ss); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := a.Remove(ms[1].Name()); err != nil { // then re-added as a fresh open would
				t.Fatal(err)
			}
			mt := newMeter(tc.want, 2*time.Second)
			if err := a.ReAddMember(&metered{Member: ms[1], mt: mt}); err != nil {
				t.Fatal(err)
			}
			st := waitStatus(t, a, "the re-added member active", func(st raid.Status) bool {
				s, _ := memberState(st, ms[1].Name())
				return s == raid.MemberActive && st.Sync == nil
			})
			if st.LastRebuild == nil || !st.LastRebuild.ReAdd || st.LastRebuild.Err != "" {
				t.Fatalf("last rebuild %+v, want a finished re-add", st.LastRebuild)
			}
			if want := int64(len(tc.regions)) * ss / 3; st.LastRebuild.Resynced != want { // regions of a stripe
				t.Errorf("re-add resynced %d bytes, want %d", st.LastRebuild.Resynced, want)
			}
			if got := mt.max(); got < tc.want {
				t.Errorf("at most %d writes of the re-added member in flight together, want %d", got, tc.want)
			}
			if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
				t.Errorf("stripes with wrong parity after the re-add: %v", bad[:min(len(bad), 10)])
			}
		})
	}
}

// windowArray returns an array of 4096 stripes of 4 KiB chunks on 4 members (64 sync batches
// of 64 stripes, a 64th of each member), with a write-intent region per stripe, its bitmap
// cleaner stopped and member 1 failed: ready to be written degraded, then re-added. The array
// is closed at the test's end.
func windowArray(t *testing.T, prefix string) (*raid.Array, []*raidtest.Mem) {
	t.Helper()
	return windowArrayWith(t, prefix, raid.IOOptions{})
}

// windowArrayWith is windowArray with opts.
func windowArrayWith(t *testing.T, prefix string, opts raid.IOOptions) (*raid.Array, []*raidtest.Mem) {
	t.Helper()
	const chunk = 4 << 10
	ms := newMems(prefix, 4, raid.DataOffset+readdStripes*chunk)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: chunk, BitmapRegion: 3 * chunk, IOOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	raid.StopBitmapCleaner(a)
	if err := a.Fail(ms[1].Name()); err != nil {
		t.Fatal(err)
	}
	return a, ms
}

// readdStripes is the stripes of windowArray's array.
const readdStripes = 4096

// stripeWriter returns the model of an array a of stripes stripes and a function that writes
// stripe s of it whole with byte b, and the model with it when the write succeeds.
func stripeWriter(a *raid.Array, stripes int64) (model []byte, write func(s int64, b byte) error) {
	ss := a.Layout().StripeSize()
	model = make([]byte, stripes*ss)
	return model, func(s int64, b byte) error {
		p := bytes.Repeat([]byte{b}, int(ss))
		_, err := a.WriteAt(p, s*ss)
		if err == nil {
			copy(model[s*ss:], p)
		}
		return err
	}
}
