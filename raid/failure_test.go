package raid_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// faultyArray creates an array of n in-memory members of chunks chunks (testChunk) each,
// fills it with random data, and reassembles it with every member wrapped in a Faulty, with
// opts. It returns the array, the wrappers, the members and the model.
func faultyArray(t *testing.T, n int, chunks int64, opts raid.AssembleOptions) (*raid.Array, []*raidtest.Faulty, []*raidtest.Mem, []byte) {
	t.Helper()
	ms := newMems("f", n, raid.DataOffset+chunks*testChunk)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk, IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	model := writeModel(t, a, uint64(n))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	fs := make([]*raidtest.Faulty, n)
	for i, m := range ms {
		m.Reopen()
		fs[i] = raidtest.NewFaulty(m)
	}
	a, err = raid.AssembleMembers(asMembers(fs), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, fs, ms, model
}

func errnoOf(err error) uint32 {
	var e interface{ Errno() uint32 }
	if errors.As(err, &e) {
		return e.Errno()
	}
	return 0
}

const eio = 5

var cacheModes = []struct {
	name string
	io   raid.IOOptions
}{
	{"cache", raid.IOOptions{WriteBackDelay: time.Millisecond}},
	{"write-through", raid.IOOptions{StripeCache: -1}},
}

// TestReadErrors: reads that fail on one member of a healthy array are served correctly by
// reconstruction, without an error, and counted; reads slower than the member timeout are
// served from the slow member itself and counted the same way; past the limit the member is
// marked faulty and reads stay correct.
func TestReadErrors(t *testing.T) {
	for _, mode := range cacheModes {
		for _, tc := range []struct {
			name    string
			limit   int
			delay   time.Duration // instead of a fault: a slow member and a short timeout
			timeout time.Duration
			faulty  bool
		}{
			{"counted", 1000, 0, 0, false},
			{"limit", 3, 0, 0, true},
			{"slow", 1000, 60 * time.Millisecond, 20 * time.Millisecond, false},
			// With a limit of 3, a machine stall longer than the timeout on three reads of a
			// healthy member would fail it too, and with it the array (1 of 30 full runs at
			// load 20 with a 20 ms timeout): the margins here are ten times wider. The slow
			// member is failed after about three reads, so the test stays short.
			{"slow-limit", 3, 600 * time.Millisecond, 250 * time.Millisecond, true},
		} {
			t.Run(mode.name+"-"+tc.name, func(t *testing.T) {
				t.Parallel()
				opts := raid.AssembleOptions{IOOptions: mode.io}
				opts.ReadErrorLimit = tc.limit
				opts.MemberTimeout = tc.timeout
				a, fs, _, model := faultyArray(t, 4, 16, opts)
				if tc.delay > 0 {
					fs[1].SetDelay(tc.delay)
				} else {
					fs[1].Inject(raidtest.Fault{Op: raidtest.OpRead, Off: raid.DataOffset, Len: 1 << 40})
				}
				compareArray(t, a, model)
				st := a.Status()
				m := st.Members[1]
				if m.ReadErrors == 0 {
					t.Fatalf("member 1: %d read errors counted; want some", m.ReadErrors)
				}
				if got := m.State == raid.MemberFaulty; got != tc.faulty {
					t.Fatalf("member 1 state %q after %d read errors (limit %d)", m.State, m.ReadErrors, tc.limit)
				}
				if tc.faulty && m.ReadErrors > uint64(tc.limit)+8 { // a few reads in flight may add one each
					t.Fatalf("%d read errors counted, limit %d: the member was not failed at the limit", m.ReadErrors, tc.limit)
				}
				fs[1].SetDelay(0)
			})
		}
	}
}

// TestWriteFailure: a member that fails a write is marked faulty; every other member's
// superblock records it (events bumped, state table) before the write returns; the array goes
// on degraded with every byte right, and the faulty member is refused as stale later.
func TestWriteFailure(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			a, fs, ms, model := faultyArray(t, 4, 16, raid.AssembleOptions{IOOptions: mode.io})
			const bad = 2
			if _, err := a.WriteAt([]byte{1}, 0); err != nil { // marks the array dirty
				t.Fatal(err)
			}
			model[0] = 1
			_, events0, _, _, _ := raid.SuperblockInfo(ms[0])
			fs[bad].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
			rng := newRand(7)
			p := make([]byte, a.Layout().StripeSize()+3*testChunk/2)
			fill(rng, p)
			off := int64(testChunk / 2)
			if _, err := a.WriteAtFUA(p, off); err != nil {
				t.Fatalf("write with a failing member: %v", err)
			}
			copy(model[off:], p)
			for r, m := range ms {
				role, ev, states, _, err := raid.SuperblockInfo(m)
				if r == bad {
					if ev != events0 {
						t.Fatalf("the faulty member's superblock was written (events %d → %d)", events0, ev)
					}
					continue
				}
				if err != nil || role != r || ev <= events0 || states[bad] != 1 {
					t.Fatalf("member %d superblock when the write returned: role %d, events %d (before %d), states %v, %v; want role %d faulty", r, role, ev, events0, states, err, bad)
				}
			}
			st := a.Status()
			if st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != bad || st.Members[bad].State != raid.MemberFaulty || st.Members[bad].WriteErrors == 0 {
				t.Fatalf("status %v, missing %v, member %+v", st.State, st.Missing, st.Members[bad])
			}
			writes := fs[bad].Count(raidtest.OpWrite)
			for range 50 { // more writes, degraded
				o, n := randRange(rng, 0, int64(len(model)), testChunk)
				fill(rng, model[o:o+n])
				if _, err := a.WriteAt(model[o:o+n], o); err != nil {
					t.Fatal(err)
				}
			}
			compareArray(t, a, model)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if n := fs[bad].Count(raidtest.OpWrite); n != writes {
				t.Fatalf("%d writes reached the faulty member after it failed", n-writes)
			}
			for _, m := range ms {
				m.Reopen()
			}
			// Given with the others, the faulty member is left out as stale (and closed).
			all, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{})
			if err != nil {
				t.Fatalf("assemble with the faulty member: %v", err)
			}
			if st := all.Status(); st.State != raid.StateDegraded || len(st.Members) != 3 || !slices.Equal(st.Missing, []int{bad}) {
				t.Fatalf("assembled with the faulty member: %v, missing %v, members %+v; want it left out", st.State, st.Missing, st.Members)
			}
			compareArray(t, all, model)
			all.Close()
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

// TestDoubleFailure: after a second member fails, reads of chunks on the lost members get EIO
// (ErrArrayFailed), every other chunk reads right, every write fails with EIO, and nothing is
// written to any member any more.
func TestDoubleFailure(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			a, fs, ms, model := faultyArray(t, 4, 16, raid.AssembleOptions{IOOptions: mode.io})
			if err := a.Fail("1"); err != nil {
				t.Fatal(err)
			}
			if st := a.Status(); st.State != raid.StateDegraded {
				t.Fatalf("after one failure: %v", st.State)
			}
			// A partial write acknowledged before the second failure stays dirty in the cache
			// (where there is one); once the array has failed it must never be written out.
			early := bytes.Repeat([]byte{0xBB}, 4096)
			if _, err := a.WriteAt(early, 2*a.Layout().StripeSize()); err != nil {
				t.Fatal(err)
			}
			copy(model[2*a.Layout().StripeSize():], early)
			// The second failure comes from a write.
			fs[3].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
			p := bytes.Repeat([]byte{0xAA}, int(a.Layout().StripeSize()))
			_, err := a.WriteAtFUA(p, 0)
			if !errors.Is(err, raid.ErrArrayFailed) || errnoOf(err) != eio {
				t.Fatalf("write that fails a second member: %v; want ErrArrayFailed (EIO)", err)
			}
			if st := a.Status(); st.State != raid.StateFailed {
				t.Fatalf("after two failures: %v", st.State)
			}
			// Stripe 0 may hold part of that write; judge the others.
			before := make([][]byte, len(ms))
			counts := make([]int, len(fs))
			for r := range ms {
				before[r] = bytes.Clone(ms[r].Bytes()[raid.DataOffset:])
				counts[r] = fs[r].Count(raidtest.OpWrite)
			}
			if _, err := a.WriteAt(p, a.Layout().StripeSize()); !errors.Is(err, raid.ErrArrayFailed) || errnoOf(err) != eio {
				t.Fatalf("write to a failed array: %v; want ErrArrayFailed (EIO)", err)
			}
			if err := a.Flush(); err == nil {
				t.Log("Flush on a failed array succeeded (nothing to write)")
			}
			got := make([]byte, testChunk)
			l := a.Layout()
			served, refused := 0, 0
			for off := l.StripeSize(); off < int64(len(model)); off += testChunk {
				loc := l.Map(off)
				n, err := a.ReadAt(got, off)
				if loc.Member == 1 || loc.Member == 3 {
					if !errors.Is(err, raid.ErrArrayFailed) || errnoOf(err) != eio || n != 0 {
						t.Fatalf("read of a lost chunk at %d (role %d): %d, %v; want EIO", off, loc.Member, n, err)
					}
					refused++
					continue
				}
				if err != nil || !bytes.Equal(got, model[off:off+testChunk]) {
					t.Fatalf("read of a surviving chunk at %d (role %d): %v, equal %v", off, loc.Member, err, bytes.Equal(got, model[off:off+testChunk]))
				}
				served++
			}
			if served == 0 || refused == 0 {
				t.Fatalf("served %d, refused %d", served, refused)
			}
			for r := range ms {
				if n := fs[r].Count(raidtest.OpWrite); n != counts[r] || !bytes.Equal(before[r], ms[r].Bytes()[raid.DataOffset:]) {
					t.Fatalf("member %d was written after the array failed (%d writes)", r, n-counts[r])
				}
			}
		})
	}
}

// TestRebuild: a member fails under concurrent writes from several goroutines (each owning
// every fourth stripe, so the model is exact); the spare added earlier is rebuilt by itself
// while the writes go on; then every byte is compared and every stripe's parity checked on the
// members, the spare now in the failed role.
func TestRebuild(t *testing.T) {
	for _, mode := range []ioMode{ioModes[0], ioModes[2], ioModes[4]} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			const chunks = 256
			a, fs, ms, model := faultyArray(t, 4, chunks, raid.AssembleOptions{IOOptions: mode.io})
			spare := raidtest.NewMem("spare", raid.DataOffset+chunks*testChunk)
			if err := a.AddSpareMember(spare); err != nil {
				t.Fatal(err)
			}
			const speed = 2 << 20 // 1 MiB per member: about half a second
			if err := a.SetSyncSpeed(speed, speed); err != nil {
				t.Fatal(err)
			}
			l := a.Layout()
			ss := l.StripeSize()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for g := range int64(4) {
				wg.Go(func() {
					rng := newRand(uint64(g) + 100)
					buf := make([]byte, ss)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						s := (rng.Int64N(int64(len(model))/ss/4))*4 + g
						o, n := randRange(rng, 0, ss, 512)
						fill(rng, buf[:n])
						var err error
						if mode.pinned {
							_, err = a.WritePinned(bytes.Clone(buf[:n]), s*ss+o, func() {})
						} else {
							_, err = a.WriteAt(buf[:n], s*ss+o)
						}
						if err != nil {
							errs <- err
							return
						}
						copy(model[s*ss+o:], buf[:n])
						if i%8 == 0 {
							time.Sleep(time.Millisecond)
						}
					}
				})
			}
			time.Sleep(20 * time.Millisecond)
			start := time.Now()
			fs[2].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
			sawSync := false
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				st := a.Status()
				if st.Sync != nil {
					sawSync = true
					// Role is -1 for the moment between the job's start and its choice of spare.
					starting := st.Sync.Role == -1 && st.Sync.Done == 0
					if st.Sync.Kind != "rebuild" || st.Sync.Role != 2 && !starting || st.Sync.Total != chunks*testChunk {
						t.Fatalf("progress %+v", *st.Sync)
					}
				}
				if st.LastRebuild != nil {
					if st.LastRebuild.Done != st.LastRebuild.Total || st.LastRebuild.Err != "" {
						t.Fatalf("rebuild ended early: %+v", *st.LastRebuild)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("rebuild did not finish: %+v", st)
				}
			}
			took := time.Since(start)
			close(stop)
			wg.Wait()
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			if !sawSync {
				t.Fatal("never saw the rebuild in Status().Sync")
			}
			if took < 200*time.Millisecond { // 1 MiB at 2 MiB/s: ~0.5 s
				t.Fatalf("rebuild took %v at %d B/s: the speed limit was not applied", took, speed)
			}
			st := a.Status()
			if len(st.Members) != 4 || st.Members[2].Path != "spare" || st.Members[2].State != raid.MemberActive || st.Members[2].Role != 2 {
				t.Fatalf("members after the rebuild: %+v", st.Members)
			}
			if st.LastRebuild == nil || st.LastRebuild.Done != st.LastRebuild.Total || st.LastRebuild.Resumed != 0 {
				t.Fatalf("last rebuild %+v", st.LastRebuild)
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			compareArray(t, a, model)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			now := []*raidtest.Mem{ms[0], ms[1], spare, ms[3]}
			if bad := badStripes(now, l); len(bad) > 0 {
				t.Fatalf("parity wrong in stripes %v", bad)
			}
			for _, m := range now {
				m.Reopen()
			}
			a2, err := raid.AssembleMembers(asMembers(now), raid.AssembleOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer a2.Close()
			if st := a2.Status(); st.State != raid.StateClean {
				t.Fatalf("reassembled after the rebuild: %v", st.State)
			}
			compareArray(t, a2, model)
		})
	}
}

// TestRebuildResume (member files): a rebuild stopped by Close resumes from its checkpoint on
// the next assembly instead of starting over; afterwards the old member is refused as stale,
// or, with RebuildStale, taken as a fresh spare.
func TestRebuildResume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	paths := memberPaths(dir, 3)
	spare := filepath.Join(dir, "spare.img")
	const chunks = 256
	size := int64(raid.DataOffset + chunks*testChunk)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: size, Spares: []string{spare}})
	if err != nil {
		t.Fatal(err)
	}
	model := writeModel(t, a, 9)
	if st := a.Status(); len(st.Members) != 4 || st.Members[3].State != raid.MemberSpare || st.Members[3].Role != -1 {
		t.Fatalf("members %+v", st.Members)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	slow := raid.IOOptions{SyncSpeedMin: 1 << 20, SyncSpeedMax: 1 << 20} // 1 MiB: ~1 s
	// Without role 1: degraded; the spare is found and rebuilt.
	now := []string{paths[0], paths[2], spare}
	a, err = raid.Assemble(now, raid.AssembleOptions{IOOptions: slow})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st := a.Status(); st.Sync != nil && st.Sync.Done >= chunks*testChunk/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rebuild did not progress: %+v", a.Status())
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	f, _ := raid.OpenMember(spare, true)
	role, _, states, recovery, err := raid.SuperblockInfo(f)
	f.Close()
	if err != nil || role != 1 || states[1] != 2 || recovery < chunks*testChunk/4 {
		t.Fatalf("spare superblock after Close mid-rebuild: role %d, states %v, recovery %d, %v", role, states, recovery, err)
	}
	a, err = raid.Assemble(now, raid.AssembleOptions{IOOptions: raid.IOOptions{SyncSpeedMax: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	var last *raid.Progress
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		// The member is active a moment before the job ends and records LastRebuild.
		st := a.Status()
		if (st.State == raid.StateClean || st.State == raid.StateActive) && st.Sync == nil {
			last = st.LastRebuild
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resumed rebuild did not finish: %+v", st)
		}
	}
	if last == nil || last.Resumed != recovery || last.Done != last.Total || last.Total-last.Resumed >= last.Total {
		t.Fatalf("resumed rebuild %+v; want it to start at the checkpoint %d", last, recovery)
	}
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := raid.Examine(now)
	if err != nil || rep.State != raid.StateClean {
		t.Fatalf("Examine after the rebuild: %v, %v", rep.State, err)
	}
	checkMembers(t, []string{paths[0], spare, paths[2]}, rep.Layout, model, -1)

	// The old member of role 1 is stale, superseded by the spare: left out (as a
	// configuration file listing every path assembles), or taken as a spare.
	all := []string{paths[0], paths[1], paths[2], spare}
	var logs recorder
	a, err = raid.Assemble(all, raid.AssembleOptions{Logger: slog.New(&logs)})
	if err != nil {
		t.Fatalf("assemble with the stale member: %v", err)
	}
	if st := a.Status(); st.State != raid.StateClean || len(st.Members) != 3 || logs.count(slog.LevelWarn) == 0 {
		t.Fatalf("with the stale member: %v, members %+v, %d warnings; want it left out, and said", st.State, st.Members, logs.count(slog.LevelWarn))
	}
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	logs = recorder{}
	a, err = raid.Assemble(all, raid.AssembleOptions{RebuildStale: true, Logger: slog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st := a.Status()
	if st.State != raid.StateClean || len(st.Members) != 4 || st.Members[3].Path != paths[1] || st.Members[3].State != raid.MemberSpare {
		t.Fatalf("with RebuildStale: %v, members %+v; want the stale member as a spare", st.State, st.Members)
	}
	if logs.count(slog.LevelWarn) == 0 {
		t.Fatal("nothing logged about the stale member")
	}
	compareArray(t, a, model)
}

// TestSyncThrottle: the sleep that keeps a sync within its limits.
func TestSyncThrottle(t *testing.T) {
	const MB = 1 << 20
	for _, tc := range []struct {
		done     int64
		elapsed  time.Duration
		min, max int64
		busy     bool
		want     time.Duration
	}{
		{10 * MB, time.Second, MB, 20 * MB, false, 0},                                 // under max: no sleep
		{10 * MB, 250 * time.Millisecond, MB, 20 * MB, false, 250 * time.Millisecond}, // 10 MB at 20 MB/s needs 500 ms
		{MB / 2, 250 * time.Millisecond, MB, 20 * MB, true, 250 * time.Millisecond},   // busy: held to min
		{MB / 8, 250 * time.Millisecond, MB, 20 * MB, true, -125 * time.Millisecond},  // busy but under min: go on
		{100 * MB, 0, MB, 20 * MB, false, time.Second},                                // capped at a second
	} {
		t.Run(fmt.Sprintf("%d-%v-busy%v", tc.done, tc.elapsed, tc.busy), func(t *testing.T) {
			got := raid.SyncThrottle(tc.done, tc.elapsed, tc.min, tc.max, tc.busy)
			if got > 0 != (tc.want > 0) || got > 0 && (got < tc.want-time.Millisecond || got > tc.want+time.Millisecond) {
				t.Fatalf("sleep %v, want %v", got, tc.want)
			}
		})
	}
}

// TestScrub (member files): a parity chunk and a data chunk corrupted in the member files are
// found by check, exactly those stripes; repair rewrites their parity; a check under
// concurrent writes then finds nothing.
func TestScrub(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	paths := memberPaths(dir, 4)
	const chunks = 64
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + chunks*testChunk})
	if err != nil {
		t.Fatal(err)
	}
	model := writeModel(t, a, 11)
	l := a.Layout()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	corrupt := func(role int, s int64) {
		f, err := os.OpenFile(paths[role], os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("garbage"), raid.DataOffset+s*testChunk+100); err != nil {
			t.Fatal(err)
		}
	}
	const pStripe, dStripe = 5, 40
	corrupt(l.ParityMember(pStripe), pStripe)
	dRole := l.DataMember(dStripe, 1)
	corrupt(dRole, dStripe)
	copy(model[(dStripe*3+1)*testChunk+100:], "garbage") // repair trusts the data, as md does

	a, err = raid.Assemble(paths, raid.AssembleOptions{IOOptions: raid.IOOptions{SyncSpeedMax: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	scrub := func(repair bool) *raid.Progress {
		t.Helper()
		if err := a.StartScrub(repair); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
			if st := a.Status(); st.Sync == nil && st.LastScrub != nil {
				return st.LastScrub
			}
			if time.Now().After(deadline) {
				t.Fatal("scrub did not finish")
			}
		}
	}
	p := scrub(false)
	if p.Kind != "check" || p.Mismatches != 2 || len(p.MismatchAt) != 2 || p.MismatchAt[0] != pStripe || p.MismatchAt[1] != dStripe || p.Done != p.Total || p.Err != "" {
		t.Fatalf("check: %+v; want mismatches at %d and %d", p, pStripe, dStripe)
	}
	if p = scrub(true); p.Kind != "repair" || p.Mismatches != 2 {
		t.Fatalf("repair: %+v", p)
	}
	if p = scrub(false); p.Mismatches != 0 {
		t.Fatalf("check after repair: %+v", p)
	}
	compareArray(t, a, model)

	// A check under concurrent writes (each goroutine owns every second stripe) finds nothing.
	if err := a.SetSyncSpeed(1<<20, 4<<20); err != nil { // 256 KiB per member: ≥ 60 ms
		t.Fatal(err)
	}
	if err := a.StartScrub(false); err != nil {
		t.Fatal(err)
	}
	if err := a.StartScrub(false); !errors.Is(err, raid.ErrBusy) {
		t.Fatalf("second StartScrub: %v; want ErrBusy", err)
	}
	ss := l.StripeSize()
	var wg sync.WaitGroup
	for g := range int64(2) {
		wg.Go(func() {
			rng := newRand(uint64(g))
			buf := make([]byte, ss)
			for a.Status().Sync != nil {
				s := rng.Int64N(chunks/2)*2 + g
				o, n := randRange(rng, 0, ss, 512)
				fill(rng, buf[:n])
				if _, err := a.WriteAt(buf[:n], s*ss+o); err != nil {
					t.Error(err)
					return
				}
				copy(model[s*ss+o:], buf[:n])
			}
		})
	}
	wg.Wait()
	if p := a.Status().LastScrub; p.Mismatches != 0 || p.Done != p.Total {
		t.Fatalf("check under writes: %+v", p)
	}
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, paths, l, model, -1)
}

// TestFaultySpec: OpenMember's faulty: specs fail reads and writes in ranges, after N
// operations, only while the control file exists, drop writes, and add latency.
func TestFaultySpec(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m")
	if err := os.WriteFile(path, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ctl := filepath.Join(dir, "ctl")
	buf := make([]byte, 4096)
	type op struct {
		write bool
		off   int64
		fail  bool
	}
	for _, tc := range []struct {
		query string
		ops   []op
	}{
		{"rfail=1M+4K", []op{{false, 0, false}, {false, 1 << 20, true}, {true, 1 << 20, false}, {false, 1<<20 + 4096, false}}},
		{"wfail=all", []op{{true, 4096, false}, {true, 1 << 20, true}, {false, 1 << 20, false}}},
		{"wfail=2M+1M&after=2", []op{{true, 2 << 20, false}, {true, 2 << 20, false}, {true, 2 << 20, true}}},
		{"rfail=all&ctl=" + ctl, []op{{false, 1 << 20, false}, {false, -1, false}, {false, 1 << 20, true}}},
	} {
		t.Run(tc.query, func(t *testing.T) {
			os.Remove(ctl)
			m, err := raid.OpenMember("faulty:"+path+"?"+tc.query, false)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Name() != path {
				t.Fatalf("Name %q", m.Name())
			}
			for i, o := range tc.ops {
				if o.off < 0 { // create the control file
					os.WriteFile(ctl, nil, 0o644)
					continue
				}
				var err error
				if o.write {
					_, err = m.WriteAt(buf, o.off)
				} else {
					_, err = m.ReadAt(buf, o.off)
				}
				if (err != nil) != o.fail || err != nil && errnoOf(err) != eio {
					t.Fatalf("op %d %+v: %v", i, o, err)
				}
			}
		})
	}
	// drop: the write succeeds and changes nothing; delay: it takes at least that long.
	m, err := raid.OpenMember("faulty:"+path+"?drop=0+1M&delay=20ms", false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	start := time.Now()
	if _, err := m.WriteAt(bytes.Repeat([]byte{1}, 10), 100); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("write took %v with delay=20ms", d)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b[100:110], make([]byte, 10)) {
		t.Fatal("a dropped write reached the file")
	}
	for _, bad := range []string{"rfail=1M", "after=x", "nope=1", "delay=fast"} {
		if _, err := raid.OpenMember("faulty:"+path+"?"+bad, false); err == nil {
			t.Fatalf("spec %q accepted", bad)
		}
	}
}

// TestManage: the management methods' results and errors (Fail, Remove, AddSpare, Replace,
// SetSyncSpeed, StopScrub).
func TestManage(t *testing.T) {
	a, _, ms, model := faultyArray(t, 3, 64, raid.AssembleOptions{})
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"fail unknown", a.Fail("nope"), raid.ErrNoSuchMember},
		{"fail bad role", a.Fail("7"), raid.ErrNoSuchMember},
		{"remove active", a.Remove("0"), raid.ErrNotFaulty},
		{"speed min > max", a.SetSyncSpeed(10<<20, 1<<20), raid.ErrBadSpeed},
		{"speed negative", a.SetSyncSpeed(-1, 0), raid.ErrBadSpeed},
		{"stop no scrub", a.StopScrub(), raid.ErrNotRunning},
		{"spare too small", a.AddSpareMember(raidtest.NewMem("small", raid.DataOffset)), raid.ErrMemberTooSmall},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) {
				t.Fatalf("%v; want %v", tc.err, tc.want)
			}
		})
	}
	if err := a.SetSyncSpeed(0, 300<<20); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); st.SyncSpeedMin != raid.DefaultSyncSpeedMin || st.SyncSpeedMax != 300<<20 {
		t.Fatalf("speeds %d, %d", st.SyncSpeedMin, st.SyncSpeedMax)
	}
	// Replace role 1 by a new member: rebuilt, then active in role 1; the old one is gone.
	repl := raidtest.NewMem("new", ms[0].Size())
	if err := a.AddSpareMember(repl); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpareMember(raidtest.NewMem("new", ms[0].Size())); !errors.Is(err, raid.ErrDuplicateMember) {
		t.Fatalf("adding a second member of the same name: %v", err)
	}
	if err := a.Replace("f1", "new"); err == nil {
		t.Fatal("Replace with an existing member's name as the new path succeeded")
	}
	if err := a.Fail("f1"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); a.Status().LastRebuild == nil; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rebuild onto the spare did not finish")
		}
	}
	st := a.Status()
	if st.State == raid.StateDegraded || len(st.Members) != 3 || st.Members[1].Path != "new" || st.Members[1].State != raid.MemberActive {
		t.Fatalf("after the rebuild: %v, %+v", st.State, st.Members)
	}
	if err := a.Remove("f1"); !errors.Is(err, raid.ErrNoSuchMember) {
		t.Fatalf("Remove of the replaced member: %v; want ErrNoSuchMember (dropped)", err)
	}
	// A faulty member can be removed; then the array has no member for the role.
	if err := a.Fail("2"); err != nil {
		t.Fatal(err)
	}
	if err := a.StartScrub(false); !errors.Is(err, raid.ErrDegraded) {
		t.Fatalf("scrub while degraded: %v", err)
	}
	if err := a.Remove("f2"); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); st.State != raid.StateDegraded || len(st.Members) != 2 || len(st.Missing) != 1 || st.Missing[0] != 2 {
		t.Fatalf("after Remove: %v, %+v, missing %v", st.State, st.Members, st.Missing)
	}
	compareArray(t, a, model)
}

// TestUnrecordedFailure: a member failure that the other members' superblocks cannot record
// fails those members too (as md does), and a failed array acknowledges no Flush — not even
// one that finds every member already faulty and so has nothing left to sync. Before, the
// failure stayed unrecorded and such a Flush returned nil: a power cut in the middle of a
// flush (TestPowerCut) then lost writes that had been reported durable.
func TestUnrecordedFailure(t *testing.T) {
	a, fs, _, _ := faultyArray(t, 3, 8, raid.AssembleOptions{})
	for _, f := range fs[1:] { // members 1 and 2 can no longer take a superblock
		f.Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.SuperblockOffset, Len: raid.SuperblockSize})
	}
	if err := a.Flush(); err != nil {
		t.Fatalf("Flush before any failure: %v", err)
	}
	if err := a.Fail("f0"); err != nil {
		t.Fatalf("Fail(f0): %v", err)
	}
	st := a.Status()
	if st.State != raid.StateFailed {
		t.Fatalf("after a failure the others could not record: state %v, members %+v", st.State, st.Members)
	}
	for i := range 2 {
		if err := a.Flush(); !errors.Is(err, raid.ErrArrayFailed) {
			t.Fatalf("Flush %d of a failed array: %v, want ErrArrayFailed", i, err)
		}
	}
	if _, err := a.WriteAtFUA(make([]byte, 4096), 0); err == nil {
		t.Fatal("a FUA write to a failed array succeeded")
	}
}
