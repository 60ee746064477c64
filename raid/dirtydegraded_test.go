package raid_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// crashWritten creates an array of three in-memory members with opts, writes data at off,
// and returns copies of the members taken with the write on them and their superblocks still
// dirty (a power cut), the array's layout stripe size and size.
func crashWritten(t *testing.T, prefix string, opts raid.CreateOptions, off int64, data []byte) (crashed []*raidtest.Mem, stripe, size int64) {
	t.Helper()
	ms := newMems(prefix, 3, memberSize)
	opts.Chunk = testChunk
	opts.IOOptions = raid.IOOptions{StripeCache: -1}
	createClosed(t, ms, opts)
	a, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		crashed = append(crashed, clone(m, fmt.Sprintf("%s%d", prefix, i)))
	}
	stripe, size = a.Layout().StripeSize(), mustSize(a)
	a.Close()
	return crashed, stripe, size
}

// TestDirtyDegradedRefused: an array that was not shut down cleanly (a power cut mid-write)
// and comes back with a member missing is refused (ErrDirtyDegraded, a *DirtyDegradedError
// naming the role and the regions whose parity may be torn), and nothing is written: the
// member can still come back, and the array then assembles whole and resyncs, every byte
// intact. Force assembles it degraded anyway, with the write hole reported; ReadOnly assembles
// it to look at, writing nothing. Without a bitmap every region is at risk.
func TestDirtyDegradedRefused(t *testing.T) {
	data := bytes.Repeat([]byte{0x5a}, 3*testChunk)
	for _, tc := range []struct {
		name        string
		consistency string
	}{{"bitmap", raid.ConsistencyBitmap}, {"none", raid.ConsistencyNone}} {
		t.Run(tc.name, func(t *testing.T) {
			off := int64(5 * testChunk)
			crashed, stripeSize, size := crashWritten(t, "dd", raid.CreateOptions{Consistency: tc.consistency}, off, data)
			left := []*raidtest.Mem{clone(crashed[0], "dd0"), clone(crashed[2], "dd2")}
			before := [][]byte{bytes.Clone(left[0].Bytes()), bytes.Clone(left[1].Bytes())}
			_, err := raid.AssembleMembers(asMembers(left), raid.AssembleOptions{})
			var dd *raid.DirtyDegradedError
			if !errors.Is(err, raid.ErrDirtyDegraded) || !errors.As(err, &dd) {
				t.Fatalf("dirty array missing role 1 assembled: %v", err)
			}
			t.Log(err)
			if dd.Role != 1 || dd.FailedBefore || len(dd.Regions) == 0 {
				t.Fatalf("refusal: role %d, failed before %v, regions %v", dd.Role, dd.FailedBefore, dd.Regions)
			}
			covered := false
			for _, r := range dd.Regions {
				if r.Off%stripeSize != 0 || r.Len%stripeSize != 0 && r.Off+r.Len != size {
					t.Fatalf("region at risk %+v is not whole stripes of %d", r, stripeSize)
				}
				covered = covered || r.Off <= off && off+int64(len(data)) <= r.Off+r.Len
			}
			if !covered {
				t.Fatalf("regions at risk %v do not cover the write at %d+%d", dd.Regions, off, len(data))
			}
			if tc.consistency == raid.ConsistencyNone && (len(dd.Regions) != 1 || dd.Regions[0].Off != 0 || dd.Regions[0].Len != size) {
				t.Fatalf("no bitmap: regions at risk %v, want the whole array [0, %d)", dd.Regions, size)
			}
			for i, m := range left {
				if !bytes.Equal(m.Bytes(), before[i]) {
					t.Fatalf("the refused assembly wrote member %s", m.Name())
				}
			}
			// Read-only: assembled, the hole reported, nothing written.
			var logs recorder
			ro, err := raid.AssembleMembers(asMembers(left), raid.AssembleOptions{ReadOnly: true, Logger: slog.New(&logs)})
			if err != nil {
				t.Fatalf("read-only: %v", err)
			}
			if st := ro.Status(); !st.WriteHole || st.State != raid.StateDegraded || logs.count(slog.LevelError) == 0 {
				t.Fatalf("read-only: write hole %v, %v, %d errors logged", st.WriteHole, st.State, logs.count(slog.LevelError))
			}
			ro.Close()
			for i, m := range left {
				m.Reopen()
				if !bytes.Equal(m.Bytes(), before[i]) {
					t.Fatalf("the read-only assembly wrote member %s", m.Name())
				}
			}
			// The member comes back: whole, resynced, every byte as written.
			whole := []*raidtest.Mem{left[0], clone(crashed[1], "dd1"), left[1]}
			a, err := raid.AssembleMembers(asMembers(whole), raid.AssembleOptions{})
			if err != nil {
				t.Fatalf("the missing member is back: %v", err)
			}
			waitResync(t, a)
			if st := a.Status(); st.State != raid.StateClean && st.State != raid.StateActive || st.WriteHole || len(st.Missing) != 0 {
				t.Fatalf("whole again: %v, write hole %v, missing %v", st.State, st.WriteHole, st.Missing)
			}
			want := make([]byte, size)
			copy(want[off:], data)
			got := make([]byte, size)
			if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("after the member came back: %v, equal %v", err, bytes.Equal(got, want))
			}
			a.Close()
			// Force: degraded, the hole reported.
			forced := []*raidtest.Mem{clone(crashed[0], "dd0"), clone(crashed[2], "dd2")}
			logs = recorder{}
			f, err := raid.AssembleMembers(asMembers(forced), raid.AssembleOptions{Force: true, Logger: slog.New(&logs)})
			if err != nil {
				t.Fatalf("forced: %v", err)
			}
			defer f.Close()
			if st := f.Status(); !st.WriteHole || st.State != raid.StateDegraded || logs.count(slog.LevelError) == 0 {
				t.Fatalf("forced: write hole %v, %v, %d errors logged", st.WriteHole, st.State, logs.count(slog.LevelError))
			}
		})
	}
}

// TestDirtyDegradedJournal: with the journal policy the same crash is no hole — the journal's
// replay completes every interrupted stripe write — so the array assembles degraded.
func TestDirtyDegradedJournal(t *testing.T) {
	const C = testChunk
	vs, ms := newVolatiles("ddj", 3, memberSize)
	jv := raidtest.NewVolatile("/nonexistent/ddj-journal", raid.MinJournalSize)
	io := raid.IOOptions{StripeCache: -1}
	a, err := raid.CreateMembers(ms, raid.CreateOptions{Chunk: C, Consistency: raid.ConsistencyJournal, Journal: jv, IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0x6b}, 3*C)
	if _, err := a.WriteAt(data, 5*C); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	raidtest.PowerCut(0, nil, append(vs, jv)...) // dirty: no clean Close reached the disks
	a.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	var logs recorder
	b, err := raid.AssembleMembers([]raid.Member{ms[0], ms[2]}, raid.AssembleOptions{Journal: jv, Logger: slog.New(&logs), IOOptions: io})
	if err != nil {
		t.Fatalf("dirty, degraded, journaled: %v", err)
	}
	defer b.Close()
	if st := b.Status(); st.WriteHole || st.State != raid.StateDegraded || logs.count(slog.LevelError) != 0 {
		t.Fatalf("write hole %v, %v, %d errors logged", st.WriteHole, st.State, logs.count(slog.LevelError))
	}
	got := make([]byte, len(data))
	if _, err := b.ReadAt(got, 5*C); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("degraded read: %v, equal %v", err, bytes.Equal(got, data))
	}
}

// TestCleanDegradedAssembles: a clean array missing a member assembles degraded, as before.
func TestCleanDegradedAssembles(t *testing.T) {
	ms := createMem(t, "cd", 3)
	a, err := raid.AssembleMembers([]raid.Member{ms[0], ms[2]}, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if st := a.Status(); st.State != raid.StateDegraded || st.WriteHole {
		t.Fatalf("clean, one missing: %v, write hole %v", st.State, st.WriteHole)
	}
}
