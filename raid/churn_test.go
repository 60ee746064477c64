package raid_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// TestChurnModel: concurrent random writes, reads, trims and zeroes (exercise, every read
// compared with the model) and FLUSHes, while another goroutine keeps failing a member and
// bringing it back, in turn by re-add (the bitmap's resync of the regions written while it was
// away, with its window of stripes rebuilt ahead) and by remove and add (a full rebuild onto
// the same file), at full sync speed so that client I/O meets the rebuild in every stripe.
// Afterwards the array must equal the model byte for byte, with the members read directly:
// every data chunk the model's and every parity chunk the XOR of its stripe's data. Each I/O
// mode of TestModel: the stripe cache copying, stable pages with mapped reads and writes,
// pinned writes, a tiny cache and write-through.
func TestChurnModel(t *testing.T) {
	for i, mode := range ioModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testChurn(t, mode, uint64(100+i))
		})
	}
}

func testChurn(t *testing.T, mode ioMode, seed uint64) {
	const chunks = 96 // 96 stripes of 3 data chunks, 24 regions of 4 stripes
	a, paths, model := readdArray(t, modeDir(t, mode), chunks, mode.io)
	if err := a.SetSyncSpeed(1<<40, 1<<40); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var rounds atomic.Int64
	var churnErr error
	var churnFailed atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := newRand(seed + 1)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := churnOnce(a, paths, rng, i); err != nil {
				churnErr = err
				churnFailed.Store(true)
				return
			}
			rounds.Add(1)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if err := a.Flush(); err != nil {
				t.Errorf("Flush: %v", err)
				return
			}
		}
	})
	// Until the churn has been round every member three times (a re-add and a full rebuild
	// of each), bounded.
	deadline := time.Now().Add(20 * time.Second)
	for j := uint64(0); rounds.Load() < 12 && time.Now().Before(deadline) && !t.Failed() && !churnFailed.Load(); j++ {
		exercise(t, a, model, seed*1000+j, 200, mode.pinned)
	}
	close(stop)
	wg.Wait()
	if churnErr != nil {
		t.Fatal(churnErr)
	}
	t.Logf("%d fail/re-add rounds", rounds.Load())
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkMembers(t, paths, a.Layout(), model, -1)
}

// churnOnce fails one member (role i%4) and brings it back: by re-add, or (every third round)
// by remove and add of the same file, a full rebuild; it waits until it is active again.
func churnOnce(a *raid.Array, paths []string, rng *rand.Rand, i int) error {
	p := paths[i%len(paths)]
	if err := a.Fail(p); err != nil {
		return fmt.Errorf("round %d: Fail(%s): %w", i, p, err)
	}
	time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	deadline := time.Now().Add(30 * time.Second)
	// A member failed with a write of its own under way is added back only once that write
	// has returned (ErrMemberBusy): try again.
	retry := func(what string, fn func(string) error) error {
		for {
			err := fn(p)
			if !errors.Is(err, raid.ErrMemberBusy) || time.Now().After(deadline) {
				if err != nil {
					return fmt.Errorf("round %d: %s(%s): %w", i, what, p, err)
				}
				return nil
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	if i%3 == 2 {
		if err := a.Remove(p); err != nil {
			return fmt.Errorf("round %d: Remove(%s): %w", i, p, err)
		}
		if err := retry("AddSpare", func(p string) error { return a.AddSpare(p) }); err != nil {
			return err
		}
	} else if err := retry("ReAdd", a.ReAdd); err != nil {
		return err
	}
	for {
		st := a.Status()
		if s, _ := memberState(st, p); s == raid.MemberActive && st.Sync == nil && len(st.Missing) == 0 {
			if st.LastRebuild != nil && st.LastRebuild.Err != "" {
				return fmt.Errorf("round %d: rebuild of %s: %s", i, p, st.LastRebuild.Err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for the member to be active again")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// TestReAddAfterTrim: trims and zeroes (punching holes, or writing zeroes) made while a member
// is away are resynced onto it by its re-add like writes: afterwards every member byte
// matches the model (data chunks the model's, parity the XOR of the data), in each I/O mode.
func TestReAddAfterTrim(t *testing.T) {
	for i, mode := range ioModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			a, paths, model := readdArray(t, modeDir(t, mode), 96, mode.io)
			ss := a.Layout().StripeSize()
			for away := range len(paths) {
				if err := a.Fail(paths[away]); err != nil {
					t.Fatal(err)
				}
				rng := newRand(uint64(10*i + away))
				for range 6 {
					off := rng.Int64N(int64(len(model)) - 3*ss)
					n := 1 + rng.Int64N(3*ss)
					var err error
					switch rng.IntN(3) {
					case 0:
						err = a.Trim(off, n)
					default:
						err = a.WriteZeroes(off, n, rng.IntN(2) == 0)
					}
					if err != nil {
						t.Fatal(err)
					}
					clear(model[off : off+n])
				}
				reAdded(t, a, paths[away])
				raid.CleanBitmap(a, 0)
			}
			compareArray(t, a, model)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			checkMembers(t, paths, a.Layout(), model, -1)
		})
	}
}
