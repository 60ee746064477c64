package raid_test

import (
	"errors"
	"testing"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// TestFlushSyncFailsArray: a Flush whose own fdatasync fails the array's second member
// returns ErrArrayFailed (EIO), as every write to a failed array does, and so does the next
// Flush. It used to return the member's sync error alone (a *MemberError, EIO, but not
// ErrArrayFailed) when the failure was its own.
func TestFlushSyncFailsArray(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			a, fs, _, _ := faultyArray(t, 4, 16, raid.AssembleOptions{IOOptions: mode.io})
			if err := a.Fail("1"); err != nil {
				t.Fatal(err)
			}
			fs[2].Inject(raidtest.Fault{Op: raidtest.OpSync})
			err := a.Flush()
			var merr *raid.MemberError
			if !errors.Is(err, raid.ErrArrayFailed) || errnoOf(err) != eio || !errors.As(err, &merr) || merr.Op != "sync" {
				t.Fatalf("Flush whose sync fails a second member: %v; want ErrArrayFailed (EIO) with the sync's *MemberError", err)
			}
			if st := a.Status(); st.State != raid.StateFailed {
				t.Fatalf("after the Flush: %v", st.State)
			}
			if err := a.Flush(); !errors.Is(err, raid.ErrArrayFailed) {
				t.Fatalf("Flush of a failed array: %v; want ErrArrayFailed", err)
			}
		})
	}
}
