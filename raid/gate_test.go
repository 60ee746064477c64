package raid_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// TestFailureDrainsWrites: a member write under way when the array fails is waited for before
// the write that failed the array returns, and nothing is written to a survivor after that.
// A degraded array (role 1 failed) has a write to member 0 held inside its system call; a
// second write then fails member 3 and with it the array. That second write must not return
// (with ErrArrayFailed) while member 0's write is still under way: once a client learns of the
// failure, the survivors hold what they will hold. Before the write gate, the failure only
// flipped a flag that writes checked before they began, and the second write returned at once.
func TestFailureDrainsWrites(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			a, fs, ms, _ := faultyArray(t, 4, 16, raid.AssembleOptions{IOOptions: mode.io})
			if err := a.Fail("1"); err != nil {
				t.Fatal(err)
			}
			l := a.Layout()
			// Offsets of one chunk on member 0 and one on member 3, in two stripes whose parity
			// is on neither member 1 nor the other one, so that each write needs no rebuild.
			on := func(member, other int, not int64) int64 {
				for off := int64(0); off < l.StripeSize()*16; off += l.ChunkSize() {
					if loc := l.Map(off); loc.Member == member && loc.Stripe != not && loc.Parity != 1 && loc.Parity != other {
						return off
					}
				}
				t.Fatalf("no chunk on member %d", member)
				return 0
			}
			off0 := on(0, 3, -1)
			off3 := on(3, 0, l.Map(off0).Stripe)

			entered, release := make(chan struct{}), make(chan struct{})
			fs[0].SetHook(func(op raidtest.Op, off int64) {
				if op == raidtest.OpWrite && off >= raid.DataOffset {
					select {
					case <-entered:
					default:
						close(entered)
						<-release
					}
				}
			})
			held := make(chan error, 1)
			go func() {
				_, err := a.WriteAtFUA(bytes.Repeat([]byte{0xCC}, int(l.ChunkSize())), off0)
				held <- err
			}()
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the write of member 0 never began")
			}

			fs[3].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
			failing := make(chan error, 1)
			go func() {
				_, err := a.WriteAtFUA(bytes.Repeat([]byte{0xDD}, int(l.ChunkSize())), off3)
				failing <- err
			}()
			deadline := time.Now().Add(10 * time.Second)
			for a.Status().State != raid.StateFailed {
				if time.Now().After(deadline) {
					t.Fatal("the array did not fail")
				}
				time.Sleep(time.Millisecond)
			}
			select {
			case err := <-failing:
				close(release)
				t.Fatalf("the write that failed the array returned (%v) while a write of member 0 was still under way", err)
			case <-time.After(time.Second):
			}
			close(release)
			if err := <-failing; !errors.Is(err, raid.ErrArrayFailed) {
				t.Fatalf("write that failed the array: %v; want ErrArrayFailed", err)
			}
			<-held // admitted before the failure: its data write went through; its result may be either

			// From now on no survivor is written: not by a write, a flush, or a cache write-out.
			before := make([][]byte, len(ms))
			counts := make([]int, len(fs))
			for r := range ms {
				before[r] = bytes.Clone(ms[r].Bytes())
				counts[r] = fs[r].Count(raidtest.OpWrite)
			}
			if _, err := a.WriteAt(bytes.Repeat([]byte{0xEE}, int(l.StripeSize())), 0); !errors.Is(err, raid.ErrArrayFailed) {
				t.Fatalf("write to a failed array: %v; want ErrArrayFailed", err)
			}
			a.Flush()
			for r := range ms {
				if n := fs[r].Count(raidtest.OpWrite); r != 1 && r != 3 && (n != counts[r] || !bytes.Equal(before[r][raid.DataOffset:], ms[r].Bytes()[raid.DataOffset:])) {
					t.Fatalf("member %d was written after the array failed (%d writes)", r, n-counts[r])
				}
			}
		})
	}
}
