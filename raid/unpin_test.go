package raid_test

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// TestFailedArrayReleasesPins: with stable pages, a partial write's whole 4 KiB units stay in
// the cache by reference to the caller's pinned buffer until they are written out. Once the
// array has failed nothing is written out again, so without more those buffers were never
// released: the NBD server waited for them for ever (DISC unanswered, SIGTERM ignored). Every
// buffer must be released soon after the failure, and what was acknowledged stays readable
// from the cache (the copy taken in its place) until Close.
func TestFailedArrayReleasesPins(t *testing.T) {
	a, fs, _, model := faultyArray(t, 4, 64, raid.AssembleOptions{IOOptions: raid.IOOptions{
		StablePages: true, WriteBackDelay: time.Hour,
	}})
	if err := a.Fail("1"); err != nil {
		t.Fatal(err)
	}
	l := a.Layout()
	var held, released atomic.Int64
	var offs []int64
	for s := int64(2); s < 40; s += 3 {
		off := s*l.StripeSize() + l.ChunkSize() // the second data chunk: one whole unit
		buf := bytes.Repeat([]byte{byte(s)}, 4096)
		held.Add(1)
		if _, err := a.WritePinned(buf, off, func() { released.Add(1) }); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], buf)
		offs = append(offs, off)
	}
	if r := released.Load(); r == held.Load() {
		t.Fatalf("all %d buffers released before any write-out: the cache kept no reference, so this test proves nothing", r)
	}
	// A second member fails under a write: the array has failed.
	fs[3].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
	for s := int64(0); s < 64 && a.Status().State != raid.StateFailed; s++ {
		a.WriteAtFUA(bytes.Repeat([]byte{0xAA}, int(l.StripeSize())), s*l.StripeSize())
	}
	if st := a.Status().State; st != raid.StateFailed {
		t.Fatalf("state %v after writes to a failing member 3", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for released.Load() < held.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pinned buffers still held 10 s after the array failed", held.Load()-released.Load(), held.Load())
		}
		time.Sleep(time.Millisecond)
	}
	// The acknowledged data is still served, from the cache's own copy.
	got := make([]byte, 4096)
	for _, off := range offs {
		if _, err := a.ReadAt(got, off); err != nil && !errors.Is(err, raid.ErrArrayFailed) {
			t.Fatalf("read at %d: %v", off, err)
		} else if err == nil && !bytes.Equal(got, model[off:off+4096]) {
			t.Fatalf("read at %d after the buffers were released: wrong data", off)
		}
	}
	// A pinned write after the failure is refused and its buffer released at once.
	done := make(chan struct{})
	if _, err := a.WritePinned(make([]byte, 4096), l.ChunkSize(), func() { close(done) }); !errors.Is(err, raid.ErrArrayFailed) {
		t.Fatalf("pinned write to a failed array: %v", err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a refused pinned write's buffer was not released")
	}
}
