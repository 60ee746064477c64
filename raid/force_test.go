package raid_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// attrLog is a slog.Handler that keeps every record's message and attributes (as text).
type attrLog struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (l *attrLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *attrLog) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message, "level": rec.Level.String()}
	rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return nil
}
func (l *attrLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *attrLog) WithGroup(string) slog.Handler      { return l }

// with returns the records that have attribute key.
func (l *attrLog) with(key string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		if _, ok := r[key]; ok {
			out = append(out, r)
		}
	}
	return out
}

// twoFailures builds the failure of issue 13 item 6 on four in-memory members: role 0 fails a
// write (ENOSPC, say) and the array goes on degraded, taking writes that rewrite the whole
// array — role 0 misses them all — and a FLUSH; then role 1 fails a write too (the same
// full filesystem) and the array fails. It returns the members (closed), the model of every
// flushed byte, and the range [foff, foff+fn) of the write that failed the array (never
// acknowledged: it may hold anything).
func twoFailures(t *testing.T, io raid.IOOptions) (ms []*raidtest.Mem, model []byte, foff, fn int64) {
	t.Helper()
	const chunks = 64
	a, fs, ms, model := faultyArray(t, 4, chunks, raid.AssembleOptions{IOOptions: io})
	foff, fn = failTwo(t, a, fs, model)
	for _, m := range ms {
		m.Reopen()
	}
	return ms, model, foff, fn
}

// failTwo is the failure of twoFailures on a, whose members are fs; it closes a.
func failTwo(t *testing.T, a *raid.Array, fs []*raidtest.Faulty, model []byte) (foff, fn int64) {
	t.Helper()
	l := a.Layout()
	rng := newRand(13)
	fs[0].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
	for off := int64(0); off < int64(len(model)); off += 3 * testChunk / 2 { // partial and whole stripes
		n := min(3*testChunk/2, int64(len(model))-off)
		fill(rng, model[off:off+n])
		if _, err := a.WriteAt(model[off:off+n], off); err != nil {
			t.Fatalf("degraded write at %d: %v", off, err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); st.State != raid.StateDegraded || !slices.Equal(st.Missing, []int{0}) {
		t.Fatalf("after role 0 failed: %v, missing %v", st.State, st.Missing)
	}
	fs[1].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
	foff, fn = 5*l.StripeSize(), l.StripeSize()
	if _, err := a.WriteAtFUA(bytes.Repeat([]byte{0xEE}, int(fn)), foff); !errors.Is(err, raid.ErrArrayFailed) {
		t.Fatalf("write that fails role 1 too: %v; want ErrArrayFailed", err)
	}
	if st := a.Status(); st.State != raid.StateFailed {
		t.Fatalf("after two failures: %v", st.State)
	}
	a.Close()
	return foff, fn
}

// compareExcept compares every byte of a with model but [skip, skip+n).
func compareExcept(t *testing.T, a *raid.Array, model []byte, skip, n int64) {
	t.Helper()
	got := make([]byte, len(model))
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatalf("read of the whole array: %v", err)
	}
	copy(got[skip:skip+n], model[skip:skip+n])
	if i := firstDiff(got, model); i < len(model) {
		t.Fatalf("array differs from the flushed data at byte %d (of %d)", i, len(model))
	}
}

// refuseUnforced checks that Assemble without Force refuses ms with ErrNeedsForce and
// ErrTooManyMissing, writing nothing, and returns the error.
func refuseUnforced(t *testing.T, ms []*raidtest.Mem) error {
	t.Helper()
	before := make([][]byte, len(ms))
	for i, m := range ms {
		before[i] = bytes.Clone(m.Bytes())
	}
	_, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{})
	if !errors.Is(err, raid.ErrNeedsForce) || !errors.Is(err, raid.ErrTooManyMissing) {
		t.Fatalf("assemble without Force: %v; want ErrNeedsForce and ErrTooManyMissing", err)
	}
	t.Log(err)
	for i, m := range ms {
		if !bytes.Equal(before[i], m.Bytes()) {
			t.Fatalf("the refused assembly wrote member %d", i)
		}
	}
	return err
}

// assembleForced assembles ms with Force (and a fast resync) and returns the array (closed by
// a cleanup) and the attributes of the one FORCED log line, after checking every byte but
// [foff, foff+fn) against model.
func assembleForced(t *testing.T, ms []*raidtest.Mem, io raid.IOOptions, model []byte, foff, fn int64) (*raid.Array, map[string]string) {
	t.Helper()
	var logs attrLog
	opts := raid.AssembleOptions{Force: true, Logger: slog.New(&logs), IOOptions: io}
	opts.SyncSpeedMin, opts.SyncSpeedMax = fastSync.SyncSpeedMin, fastSync.SyncSpeedMax
	a, err := raid.AssembleMembers(asMembers(ms), opts)
	if err != nil {
		t.Fatalf("assemble with Force: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	compareExcept(t, a, model, foff, fn)
	forced := logs.with("forced")
	if len(forced) != 1 {
		t.Fatalf("the forced assembly's log: %v; want one line naming what it trusts", forced)
	}
	return a, forced[0]
}

// awaitForced waits until the forced array a is whole, in sync and clean, and has run a
// rebuild if rebuilt, then checks every byte but [foff, foff+fn) against model, closes a and
// checks every stripe's parity on ms and that they assemble clean, with every byte again.
func awaitForced(t *testing.T, a *raid.Array, ms []*raidtest.Mem, model []byte, foff, fn int64, rebuilt bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := a.Status()
		if st.State == raid.StateActive && st.Sync == nil && !st.Unclean && len(st.Missing) == 0 && (!rebuilt || st.LastRebuild != nil) {
			if !rebuilt && st.LastRebuild != nil {
				t.Fatalf("a rebuild ran (%+v); want none", st.LastRebuild)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rebuild or resync after the forced assembly: %+v", st)
		}
	}
	compareExcept(t, a, model, foff, fn)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		m.Reopen()
	}
	if bad := inconsistent(t, asMembers(ms), a.Layout()); len(bad) != 0 {
		t.Fatalf("stripes %v have wrong parity after the forced assembly", bad)
	}
	b, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{})
	if err != nil {
		t.Fatalf("assemble after the forced one: %v", err)
	}
	defer b.Close()
	if st := b.Status(); st.State != raid.StateClean || len(st.Members) != len(ms) {
		t.Fatalf("after the forced assembly and a clean stop: %v, members %+v", st.State, st.Members)
	}
	compareExcept(t, b, model, foff, fn)
}

// TestForceAssemble (issue 13 item 6): after a two-member failure that lost nothing, Assemble
// refuses with ErrNeedsForce (and ErrTooManyMissing), writing nothing; with Force it trusts
// role 1 — which stopped only when the array failed — with roles 2 and 3, and rebuilds role 0,
// which missed every write since it failed, from them; every flushed byte reads back, before
// and after the rebuild and resync, and afterwards every stripe's parity is right.
func TestForceAssemble(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			ms, model, foff, fn := twoFailures(t, mode.io)
			refuseUnforced(t, ms)
			// RebuildStale alone does not force anything either.
			if _, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{RebuildStale: true}); !errors.Is(err, raid.ErrNeedsForce) {
				t.Fatalf("assemble with RebuildStale: %v; want ErrNeedsForce", err)
			}

			a, forced := assembleForced(t, ms, mode.io, model, foff, fn)
			if !strings.Contains(forced["forced"], ms[1].Name()+" (role 1, events ") ||
				!strings.Contains(forced["trusted"], ms[2].Name()) || !strings.Contains(forced["trusted"], ms[3].Name()) ||
				strings.Contains(forced["trusted"], ms[0].Name()) || !strings.Contains(forced["then"], ms[0].Name()) {
				t.Fatalf("the forced assembly's log: %v; want it to name what it trusts and what it rebuilds", forced)
			}
			awaitForced(t, a, ms, model, foff, fn, true)
		})
	}
}

// TestForceAssembleReadOnly: Force with ReadOnly serves the forced array without writing a
// byte: every flushed byte reads back (degraded, role 0 left out), the write hole of the
// stripes being written at the failure is reported, and the members are as they were.
func TestForceAssembleReadOnly(t *testing.T) {
	ms, model, foff, fn := twoFailures(t, raid.IOOptions{StripeCache: -1})
	before := make([][]byte, len(ms))
	for i, m := range ms {
		before[i] = bytes.Clone(m.Bytes())
	}
	a, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{Force: true, ReadOnly: true})
	if err != nil {
		t.Fatalf("assemble with Force, read-only: %v", err)
	}
	st := a.Status()
	if st.State != raid.StateDegraded || !slices.Equal(st.Missing, []int{0}) || !st.WriteHole || !st.ReadOnly {
		t.Fatalf("forced read-only: %v, missing %v, write hole %v, read-only %v", st.State, st.Missing, st.WriteHole, st.ReadOnly)
	}
	compareExcept(t, a, model, foff, fn)
	a.Close()
	for i, m := range ms {
		if !bytes.Equal(before[i], m.Bytes()) {
			t.Fatalf("the read-only forced assembly wrote member %d", i)
		}
	}
}

// TestForceRefusals: Force trusts only members that stopped with the array. Role 0, which
// failed while the array still had every role (it missed the writes taken degraded), is
// never forced.
func TestForceRefusals(t *testing.T) {
	ms, _, _, _ := twoFailures(t, raid.IOOptions{StripeCache: -1})
	_, err := raid.AssembleMembers([]raid.Member{ms[0], ms[2], ms[3]}, raid.AssembleOptions{Force: true})
	if !errors.Is(err, raid.ErrTooManyMissing) || !errors.Is(err, raid.ErrStaleMember) || errors.Is(err, raid.ErrNeedsForce) {
		t.Fatalf("Force with the first member to fail: %v; want ErrTooManyMissing, ErrStaleMember, not ErrNeedsForce", err)
	}
}

// TestForceDuringRebuild: a member that fails while another role is being rebuilt fails the
// array (the role being rebuilt counts as lost), so the array takes no write after it and
// Force may trust it: the assembly resumes the rebuild onto the spare, and every byte but
// those of the write that failed reads back, with every stripe's parity right after the
// rebuild and resync.
func TestForceDuringRebuild(t *testing.T) {
	const chunks = 64
	a, fs, ms, model := faultyArray(t, 4, chunks, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1, SyncSpeedMin: 1 << 16, SyncSpeedMax: 1 << 16}})
	spare := raidtest.NewMem("spare", raid.DataOffset+chunks*testChunk)
	if err := a.AddSpareMember(spare); err != nil {
		t.Fatal(err)
	}
	if err := a.Fail("0"); err != nil { // the spare starts rebuilding into role 0, slowly
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); a.Status().Sync == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no rebuild started")
		}
	}
	fs[1].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
	S := a.Layout().StripeSize()
	if _, err := a.WriteAtFUA(bytes.Repeat([]byte{1}, int(S)), 40*S); !errors.Is(err, raid.ErrArrayFailed) {
		t.Fatalf("the write that fails role 1 during the rebuild of role 0: %v, want ErrArrayFailed", err)
	}
	if st := a.Status(); st.State != raid.StateFailed {
		t.Fatalf("role 1 failed during the rebuild of role 0: %v, %+v", st.State, st.Members)
	}
	a.Close()
	for _, m := range append(ms, spare) {
		m.Reopen()
	}
	b, err := raid.AssembleMembers(append(asMembers(ms), spare), raid.AssembleOptions{Force: true, IOOptions: fastSync})
	if err != nil {
		t.Fatalf("Force after a failure during a rebuild: %v", err)
	}
	defer b.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := b.Status()
		if st.State == raid.StateActive && st.Sync == nil && !st.Unclean && len(st.Missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rebuild and resync after the forced assembly: %+v", st)
		}
	}
	compareExcept(t, b, model, 40*S, S)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	members := []*raidtest.Mem{spare, ms[1], ms[2], ms[3]}
	for _, m := range members {
		m.Reopen()
	}
	if bad := inconsistent(t, asMembers(members), a.Layout()); len(bad) != 0 {
		t.Fatalf("stripes %v have wrong parity after the rebuild and resync", bad)
	}
}

// TestWriteHoleReadOnly (issue 13 item 11): a dirty array assembled degraded and read-only
// reports the write hole as a (forced) read-write assembly does (Status.WriteHole, an error
// logged): reads of the missing member's chunks use parity that may not match.
func TestWriteHoleReadOnly(t *testing.T) {
	ms := createMem(t, "w", 3)
	a, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt([]byte("dirty"), 0); err != nil {
		t.Fatal(err)
	}
	// A crash: the members as they are now, superblocks dirty.
	crashed := []*raidtest.Mem{clone(ms[0], "w0"), clone(ms[2], "w2")}
	a.Close()
	for _, ro := range []bool{false, true} {
		t.Run(fmt.Sprintf("read-only=%v", ro), func(t *testing.T) {
			c := []*raidtest.Mem{clone(crashed[0], "w0"), clone(crashed[1], "w2")}
			var logs recorder
			b, err := raid.AssembleMembers(asMembers(c), raid.AssembleOptions{ReadOnly: ro, Force: !ro, Logger: slog.New(&logs)})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if st := b.Status(); !st.WriteHole || !st.Unclean || st.State != raid.StateDegraded || logs.count(slog.LevelError) == 0 {
				t.Fatalf("dirty and degraded: write hole %v, unclean %v, %v, %d errors logged", st.WriteHole, st.Unclean, st.State, logs.count(slog.LevelError))
			}
		})
	}
}

// asFiles writes the contents of ms to files m0.img, m1.img... in a temporary directory, for
// Examine, and returns their paths.
func asFiles(t *testing.T, ms []*raidtest.Mem) []string {
	t.Helper()
	dir := t.TempDir()
	paths := make([]string, len(ms))
	for i, m := range ms {
		paths[i] = filepath.Join(dir, fmt.Sprintf("m%d.img", i))
		if err := os.WriteFile(paths[i], m.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return paths
}

// TestExamineForceable: Examine of a failed array that Force can bring back names the members
// Force would trust, as Assemble decides (offline status shows it); of the first member to
// fail alone with the fresh ones, none.
func TestExamineForceable(t *testing.T) {
	ms, _, _, _ := twoFailures(t, raid.IOOptions{StripeCache: -1})
	paths := asFiles(t, ms)
	rep, err := raid.Examine(paths)
	if err != nil || rep.State != raid.StateFailed || !slices.Equal(rep.Forceable, []string{paths[1]}) {
		t.Fatalf("Examine of the failed array: %v, %v, forceable %v; want failed, %s forceable", err, rep.State, rep.Forceable, paths[1])
	}
	rep, err = raid.Examine([]string{paths[0], paths[2], paths[3]})
	if err != nil || rep.State != raid.StateFailed || len(rep.Forceable) != 0 {
		t.Fatalf("Examine without role 1: %v, %v, forceable %v; want failed, none forceable", err, rep.State, rep.Forceable)
	}
}

// TestForceAssembleJournal: Force on an array with the journal policy replays the journal
// onto the trusted members (instead of a resync) and rebuilds the first member to fail;
// every flushed byte reads back and afterwards every stripe's parity is right.
func TestForceAssembleJournal(t *testing.T) {
	const chunks = 64
	ms := newMems("j", 4, raid.DataOffset+chunks*testChunk)
	jm := raidtest.NewMem("/nonexistent/j-journal", 2<<20)
	io := raid.IOOptions{StripeCache: -1, SyncSpeedMin: 1 << 40, SyncSpeedMax: 1 << 40}
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk, Consistency: raid.ConsistencyJournal, Journal: jm, IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	model := writeModel(t, a, 5)
	a.Close()
	fs := make([]*raidtest.Faulty, len(ms))
	for i, m := range ms {
		m.Reopen()
		fs[i] = raidtest.NewFaulty(m)
	}
	jm.Reopen()
	a, err = raid.AssembleMembers(asMembers(fs), raid.AssembleOptions{Journal: jm, IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	foff, fn := failTwo(t, a, fs, model)
	for _, m := range append(ms, jm) {
		m.Reopen()
	}
	if _, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{Journal: jm}); !errors.Is(err, raid.ErrNeedsForce) {
		t.Fatalf("assemble without Force: %v; want ErrNeedsForce", err)
	}
	b, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{Journal: jm, Force: true, IOOptions: io})
	if err != nil {
		t.Fatalf("assemble with Force: %v", err)
	}
	defer b.Close()
	compareExcept(t, b, model, foff, fn)
	awaitForced(t, b, ms, model, foff, fn, true)
}

// TestForceTwoTogether: roles 2 and 3 fail, either in one batch of member writes (a write
// across many stripes reaching both, each failing with neither failure recorded in the other's
// superblock: both stopped at the same events counter, as two members filling one filesystem
// do) or in separate batches (role 2 first; the array takes writes degraded and a FLUSH; then
// role 3). Either way nothing acknowledged is lost, and for each order Examine names the
// members Force would trust, Assemble without Force refuses (ErrNeedsForce) writing nothing,
// and Force brings the array back with every flushed byte, before and after its rebuild or
// resync, parity right in every stripe afterwards. Failed together, both are trusted (md's
// --force takes every device of the newest events counter): each holds every acknowledged
// write to its own chunks, and rebuilding either from the stripes torn by the failing batch
// could only make a chunk wrong. Failed one after the other, role 3 is trusted and role 2,
// which missed the writes taken degraded, is rebuilt.
func TestForceTwoTogether(t *testing.T) {
	for _, order := range []string{"same batch", "separate batches"} {
		for _, mode := range cacheModes {
			t.Run(order+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				forceTwoTogether(t, order == "same batch", mode.io)
			})
		}
	}
}

func forceTwoTogether(t *testing.T, together bool, io raid.IOOptions) {
	const chunks = 64
	a, fs, ms, model := faultyArray(t, 4, chunks, raid.AssembleOptions{IOOptions: io})
	l := a.Layout()
	S := l.StripeSize()
	dataOnly := raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40}
	// A write before the faults: the array is marked dirty, as a serving array is.
	fill(newRand(19), model[:S])
	if _, err := a.WriteAt(model[:S], 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if together {
		// Data writes fail (ENOSPC on a full filesystem), and so do superblock writes:
		// whichever member fails first, the record of its failure cannot reach the other,
		// which fails with it, as when both are marked faulty before either failure is
		// recorded. Bitmap writes succeed (their blocks were allocated long before).
		for _, f := range fs[2:] {
			f.Inject(dataOnly)
			f.Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.SuperblockOffset, Len: raid.SuperblockSize})
		}
	} else {
		fs[2].Inject(dataOnly)
		rng := newRand(17)
		for off := int64(0); off < 32*S; off += S / 2 { // partial and whole stripes
			fill(rng, model[off:off+S/2])
			if _, err := a.WriteAt(model[off:off+S/2], off); err != nil {
				t.Fatalf("degraded write at %d: %v", off, err)
			}
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		if st := a.Status(); st.State != raid.StateDegraded || !slices.Equal(st.Missing, []int{2}) {
			t.Fatalf("after role 2 failed: %v, missing %v", st.State, st.Missing)
		}
		fs[3].Inject(dataOnly)
	}
	// 24 stripes, 384 KiB of member writes: a batch written concurrently on the members. It
	// starts in stripe 1 at its second data chunk (role 0; parity on role 2), so the stripe's
	// first data chunk (role 3) holds flushed data that the write does not cover: rebuilt
	// from the stripe the failing write tore, it would be wrong.
	foff, fn := S+l.ChunkSize(), 24*S
	if _, err := a.WriteAtFUA(bytes.Repeat([]byte{0xEE}, int(fn)), foff); !errors.Is(err, raid.ErrArrayFailed) {
		t.Fatalf("the write that fails the array: %v; want ErrArrayFailed", err)
	}
	if st := a.Status(); st.State != raid.StateFailed {
		t.Fatalf("after roles 2 and 3 failed: %v", st.State)
	}
	a.Close()
	for _, m := range ms {
		m.Reopen()
	}
	trusted := []int{3} // forced
	if together {
		trusted = []int{2, 3}
	}

	// Offline: failed, and Force can bring it back, trusting the same members.
	paths := asFiles(t, ms)
	var want []string
	for _, r := range trusted {
		want = append(want, paths[r])
	}
	if rep, err := raid.Examine(paths); err != nil || rep.State != raid.StateFailed || !slices.Equal(rep.Forceable, want) {
		t.Fatalf("Examine of the failed array: %v, %v, forceable %v; want failed, %v forceable", err, rep.State, rep.Forceable, want)
	}

	refuseUnforced(t, ms)

	b, forced := assembleForced(t, ms, io, model, foff, fn)
	for r, m := range ms {
		isForced, rebuilt := slices.Contains(trusted, r), r == 2 && !together
		if strings.Contains(forced["forced"], m.Name()+" (role") != isForced ||
			strings.Contains(forced["trusted"], m.Name()+" (role") != (r < 2) ||
			strings.Contains(forced["then"], m.Name()+" (role") != rebuilt {
			t.Fatalf("the forced assembly's log: %v; want role %d forced %v, rebuilt %v", forced, r, isForced, rebuilt)
		}
	}
	awaitForced(t, b, ms, model, foff, fn, !together)
}
