package raid_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// held is a member whose writes at off wait until release is closed, as a member over a
// slow network makes them wait; arrived is closed at the first.
type held struct {
	raid.Member
	off     int64
	once    sync.Once
	arrived chan struct{}
	release chan struct{}
}

func (h *held) WriteAt(p []byte, off int64) (int, error) {
	if off == h.off {
		h.once.Do(func() { close(h.arrived) })
		<-h.release
	}
	return h.Member.WriteAt(p, off)
}

// TestReAddLocksPieces: while a re-add's write of one region to the member waits (a slow
// network), client writes to stripes outside the pieces being resynced go ahead, and the
// re-added member gets them: the re-add holds the locks of the stripes it resyncs, not of
// its whole span (which, at 1024 stripes or more, were all of them: every client request
// waited for the slowest of up to 8 resyncs). One write lands in a clean stripe between two
// regions being resynced, one in a region being resynced after the one held; every byte and
// every stripe's parity are checked after.
func TestReAddLocksPieces(t *testing.T) {
	a, ms := windowArray(t, "l")
	model, write := stripeWriter(a, readdStripes)
	for s := int64(0); s < readdStripes; s += 600 { // 7 regions of a stripe, 9 batches apart
		if err := write(s, 0xa5); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove(ms[1].Name()); err != nil {
		t.Fatal(err)
	}
	// The re-add's write of the first region (stripe 0) waits.
	h := &held{Member: ms[1], off: raid.DataOffset, arrived: make(chan struct{}), release: make(chan struct{})}
	if err := a.ReAddMember(h); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.arrived:
	case <-time.After(30 * time.Second):
		close(h.release)
		t.Fatal("the re-add wrote nothing to the member in 30 s")
	}
	done := make(chan error, 1)
	go func() {
		for _, s := range []int64{300, 3000} {
			if err := write(s, byte(s)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	var werr error
	waited := false
	select {
	case werr = <-done:
	case <-time.After(10 * time.Second):
		waited = true
	}
	close(h.release)
	if waited {
		t.Error("client writes outside the stripes being resynced waited 10 s for the re-add's member write")
		werr = <-done
	}
	if werr != nil {
		t.Fatal(werr)
	}
	st := waitStatus(t, a, "the re-added member active", func(st raid.Status) bool {
		s, _ := memberState(st, ms[1].Name())
		return s == raid.MemberActive && st.Sync == nil
	})
	if st.LastRebuild == nil || !st.LastRebuild.ReAdd || st.LastRebuild.Err != "" {
		t.Fatalf("last rebuild %+v, want a finished re-add", st.LastRebuild)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(model))
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Errorf("array differs from the model at byte %d", firstDiff(got, model))
	}
	if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
		t.Errorf("stripes with wrong parity after the re-add: %v", bad[:min(len(bad), 10)])
	}
}
