package raid_test

import (
	"bytes"
	"runtime/debug"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// TestCloseBitmapWriteFails: a member whose bitmap write fails during Close (the final clear
// of the write-intent bitmap) is failed like any other member whose write fails, and Close
// returns: the array is left degraded, every byte intact. Close used to clear the bitmap under
// sbMu, and failing the member takes sbMu, so Close never returned.
func TestCloseBitmapWriteFails(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			a, fs, ms, model := faultyArray(t, 4, 16, raid.AssembleOptions{IOOptions: mode.io})
			if a.Status().Bitmap == nil {
				t.Fatal("the array has no write-intent bitmap")
			}
			// The bit set below must still be set at Close: on a loaded machine the region
			// can be idle for BitmapClearDelay before Close, and the cleaner would clear it
			// (and Close then write no bitmap at all).
			raid.StopBitmapCleaner(a)
			p := bytes.Repeat([]byte{0xCD}, 4096)
			if _, err := a.WriteAt(p, 4096); err != nil { // sets a region's bit
				t.Fatal(err)
			}
			copy(model[4096:], p)
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			fs[1].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.BitmapOffset, Len: raid.DataOffset - raid.BitmapOffset})
			if st := a.Status(); st.Bitmap.Set == 0 {
				t.Fatal("no bit is set before Close: Close would write no bitmap")
			}
			done := make(chan error, 1)
			go func() { done <- a.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Close: %v", err)
				}
			case <-time.After(30 * time.Second):
				// Not t.Fatal, nor a panic here: the cleanup's Close would wait for this one
				// for ever. A panic on a goroutine of its own ends the test binary at once,
				// with every goroutine's stack (the deadlock).
				debug.SetTraceback("all")
				go func() { panic("Close did not return within 30 s after a bitmap write failed") }()
				select {}
			}
			for _, m := range ms {
				m.Reopen()
			}
			b, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{IOOptions: mode.io})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if st := b.Status(); st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != 1 {
				t.Fatalf("after Close: state %v, missing %v; want degraded without role 1", st.State, st.Missing)
			}
			got := make([]byte, len(model))
			if _, err := b.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, model) {
				t.Fatalf("byte %d differs after reassembly", firstDiff(got, model))
			}
		})
	}
}
