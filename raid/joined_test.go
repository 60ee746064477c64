package raid_test

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// TestJoinedWriteFailure: a stream of sequential pinned writes that are not multiples of the
// stripe (32 KiB over 12 KiB stripes, as the kernel client's 128 KiB requests over 48 KiB
// ones: 2 of 3 start inside a stripe the previous write left in the cache, which the stripe
// cache joins to the write's batch of whole stripes), with a member whose writes start failing
// mid-stream, under a FUA write or not: every write succeeds (degraded from then on), each is
// read back at once, every pinned buffer is released once, and after a Flush every byte reads
// as the model, also from the array assembled again without the failed member.
func TestJoinedWriteFailure(t *testing.T) {
	for _, stable := range []bool{true, false} {
		for _, fua := range []bool{false, true} {
			t.Run(fmt.Sprintf("stable-%v-fua-%v", stable, fua), func(t *testing.T) {
				t.Parallel()
				a, fs, ms, model := faultyArray(t, 4, 192, raid.AssembleOptions{IOOptions: raid.IOOptions{
					WriteBackDelay: time.Hour, StablePages: stable}})
				const bad, W = 1, 32 << 10
				rng := newRand(11)
				var outstanding sync.WaitGroup
				for i := int64(0); (i+1)*W <= int64(len(model)); i++ {
					off := i * W
					if i == 7 {
						fs[bad].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
					}
					p := make([]byte, W)
					fill(rng, p)
					copy(model[off:], p)
					var err error
					if fua && i == 7 {
						_, err = a.WriteAtFUA(p, off)
					} else {
						var calls atomic.Int32
						outstanding.Add(1)
						_, err = a.WritePinned(p, off, func() {
							if calls.Add(1) != 1 {
								t.Errorf("write %d: released twice", i)
								return
							}
							for j := range p {
								p[j] = 0xee
							}
							outstanding.Done()
						})
					}
					if err != nil {
						t.Fatalf("write %d at %d: %v", i, off, err)
					}
					got := make([]byte, W)
					if _, err := a.ReadAt(got, off); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, model[off:off+W]) {
						j := firstDiff(got, model[off:off+W])
						t.Fatalf("write %d: read back differs at %d", i, off+int64(j))
					}
				}
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				outstanding.Wait()
				if st := a.Status(); st.State != raid.StateDegraded {
					t.Fatalf("state %v after member %d's writes failed, want degraded", st.State, bad)
				}
				compareArray(t, a, model)
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				for _, m := range ms {
					m.Reopen()
				}
				rest := append(asMembers(ms[:bad:bad]), asMembers(ms[bad+1:])...)
				a2, err := raid.AssembleMembers(rest, raid.AssembleOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer a2.Close()
				compareArray(t, a2, model)
			})
		}
	}
}
