package raid_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// TestAddSpareSameFile: a spare that is a member's file under another name (a hard link, a
// volatile: spec of it) or the journal's file is refused before anything is written to it —
// a rebuild onto it would overwrite a live member or the journal.
func TestAddSpareSameFile(t *testing.T) {
	dir := t.TempDir()
	paths := memberPaths(dir, 3)
	journal := filepath.Join(dir, "journal")
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + 16*testChunk,
		Consistency: raid.ConsistencyJournal, JournalPath: journal, JournalSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := make([]byte, 3*testChunk)
	fill(newRand(3), p)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "m0-link.img")
	jlink := filepath.Join(dir, "journal-link")
	if err := os.Link(paths[0], link); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(journal, jlink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spare, file string
		want        error
	}{
		{paths[0], paths[0], raid.ErrDuplicateMember},
		{link, paths[0], raid.ErrDuplicateMember},
		{"volatile:" + link, paths[0], raid.ErrDuplicateMember},
		{jlink, journal, raid.ErrJournalOnMember},
	} {
		before, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.AddSpare(c.spare); !errors.Is(err, c.want) {
			t.Errorf("AddSpare(%s): %v, want %v", c.spare, err, c.want)
		}
		after, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before, after) {
			t.Errorf("AddSpare(%s) changed %s", c.spare, c.file)
		}
	}
	if st := a.Status(); len(st.Members) != 3 {
		t.Errorf("status lists %d members, want the 3 of the array and no spare", len(st.Members))
	}
}

// newFileArray creates an array of n member files of chunks chunks (testChunk) each in dir,
// with spares (paths, created the same size), fills it with random data and flushes it.
func newFileArray(t *testing.T, dir string, n int, chunks int64, spares ...string) (*raid.Array, []string, []byte) {
	t.Helper()
	paths := memberPaths(dir, n)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + chunks*testChunk, Spares: spares})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	model := writeModel(t, a, uint64(n)*uint64(chunks))
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, paths, model
}

// memberState returns the state and role Status gives the member at path ("" if not listed).
func memberState(st raid.Status, path string) (string, int) {
	for _, m := range st.Members {
		if m.Path == path {
			return m.State, m.Role
		}
	}
	return "", -1
}

// waitStatus polls a's status until cond holds (bounded).
func waitStatus(t *testing.T, a *raid.Array, what string, cond func(raid.Status) bool) raid.Status {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := a.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v, sync %+v, members %+v", what, st.State, st.Sync, st.Members)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestFailDuringRebuild: a Fail that would leave two roles without a working member is
// refused with ErrWouldFail — also while a role is being rebuilt, whose member serves only the
// stripes the rebuild has reached — and nothing changes; with raid.Force it is done, and then
// the array says failed (Status, Flush), serves every chunk it still can byte for byte, and
// Close does not mark the superblocks clean. Before, the Fail was accepted, Status said
// "degraded", and Close marked the failed array clean.
func TestFailDuringRebuild(t *testing.T) {
	dir := t.TempDir()
	a, paths, model := newFileArray(t, dir, 4, 64)
	if err := a.Fail("1"); err != nil {
		t.Fatal(err)
	}
	// A degraded array: failing another member would fail it.
	if err := a.Fail("2"); !errors.Is(err, raid.ErrWouldFail) {
		t.Fatalf("Fail(2) of a degraded array: %v, want ErrWouldFail", err)
	}
	if err := a.Fail("1"); err != nil {
		t.Fatalf("Fail of the member already faulty: %v", err)
	}
	// A rebuild of role 1 onto a spare that stops after its first batch (1 byte/s).
	if err := a.SetSyncSpeed(1, 1); err != nil {
		t.Fatal(err)
	}
	spare := filepath.Join(dir, "spare.img")
	if err := os.WriteFile(spare, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(spare, raid.DataOffset+64*testChunk); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpare(spare); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the rebuild to begin", func(st raid.Status) bool {
		return st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Done > 0
	})
	for _, m := range []string{"3", paths[3], "0", "2"} {
		if err := a.Fail(m); !errors.Is(err, raid.ErrWouldFail) {
			t.Fatalf("Fail(%s) during the rebuild of role 1: %v, want ErrWouldFail", m, err)
		}
	}
	st := a.Status()
	if st.State != raid.StateDegraded || st.Sync == nil {
		t.Fatalf("after the refused Fail: %v, sync %+v", st.State, st.Sync)
	}
	if state, _ := memberState(st, paths[3]); state != raid.MemberActive {
		t.Fatalf("after the refused Fail member 3 is %q", state)
	}

	if err := a.Fail("3", raid.Force); err != nil {
		t.Fatalf("Fail(3, Force): %v", err)
	}
	st = waitStatus(t, a, "the rebuild to stop", func(st raid.Status) bool { return st.Sync == nil && st.LastRebuild != nil })
	if st.State != raid.StateFailed {
		t.Fatalf("after the forced Fail: state %v, members %+v", st.State, st.Members)
	}
	if err := a.Flush(); !errors.Is(err, raid.ErrArrayFailed) {
		t.Fatalf("Flush of the failed array: %v, want ErrArrayFailed", err)
	}
	// Below the rebuild's position every chunk reads right; above it those of roles 1 and 3
	// are lost (EIO) and the others read right.
	l := a.Layout()
	rebuilt := st.LastRebuild.Done / l.ChunkSize()
	if rebuilt <= 0 || rebuilt >= 64 {
		t.Fatalf("rebuild stopped at %d stripes of 64", rebuilt)
	}
	got := make([]byte, testChunk)
	for off := int64(0); off < int64(len(model)); off += testChunk {
		loc := l.Map(off)
		_, err := a.ReadAt(got, off)
		if off/l.StripeSize() >= rebuilt && (loc.Member == 1 || loc.Member == 3) {
			if !errors.Is(err, raid.ErrArrayFailed) {
				t.Fatalf("read of a lost chunk at %d (role %d): %v, want ErrArrayFailed", off, loc.Member, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, model[off:off+testChunk]) {
			t.Fatalf("read at %d (stripe %d, role %d): %v, or not the data written", off, off/l.StripeSize(), loc.Member, err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close of the failed array: %v", err)
	}
	rep, err := raid.Examine(append(paths, spare))
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Dirty {
		t.Errorf("after Close of the failed array its superblocks say clean")
	}

	// Nothing was written after the failure, so member 3 still holds its role's data: the
	// array can be assembled with Force (trusting member 3) and the rebuild of role 1 resumes;
	// every byte written before the failure reads back, and the members check.
	all := append(paths, spare)
	if _, err := raid.Assemble(all, raid.AssembleOptions{}); !errors.Is(err, raid.ErrNeedsForce) {
		t.Fatalf("Assemble of the failed array: %v, want ErrNeedsForce", err)
	}
	b, err := raid.Assemble(all, raid.AssembleOptions{Force: true})
	if err != nil {
		t.Fatalf("Assemble with Force after the forced Fail: %v", err)
	}
	defer b.Close()
	if err := b.SetSyncSpeed(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, b, "the resumed rebuild and the resync", func(st raid.Status) bool {
		return st.Sync == nil && len(st.Missing) == 0
	})
	if state, role := memberState(st, spare); state != raid.MemberActive || role != 1 {
		t.Errorf("after the forced assembly the spare is %q in role %d, want active in role 1", state, role)
	}
	compareArray(t, b, model)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, []string{paths[0], spare, paths[2], paths[3]}, l, model, -1)
}

// TestReplaceNamedSpare: Replace rebuilds onto the member it names, not onto a spare that was
// there before, which stays a spare; the new member's chunks are the old member's, byte for
// byte. Before, the existing spare took the role and the named member was left a spare.
func TestReplaceNamedSpare(t *testing.T) {
	dir := t.TempDir()
	spareA := filepath.Join(dir, "a.img")
	a, paths, model := newFileArray(t, dir, 3, 64, spareA)
	repl := filepath.Join(dir, "b.img")
	if err := os.WriteFile(repl, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(repl, raid.DataOffset+64*testChunk); err != nil {
		t.Fatal(err)
	}
	if err := a.Replace("0", repl); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, a, "the rebuild to finish", func(st raid.Status) bool {
		return st.LastRebuild != nil && st.Sync == nil && len(st.Missing) == 0
	})
	if state, role := memberState(st, repl); state != raid.MemberActive || role != 0 {
		t.Errorf("replacement %s: %q in role %d, want active in role 0", repl, state, role)
	}
	if state, role := memberState(st, spareA); state != raid.MemberSpare || role != -1 {
		t.Errorf("spare %s: %q in role %d, want it still a spare", spareA, state, role)
	}
	if state, _ := memberState(st, paths[0]); state == raid.MemberActive {
		t.Errorf("replaced member %s still active", paths[0])
	}
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, []string{repl, paths[1], paths[2]}, a.Layout(), model, -1)
}

// TestAddAfterRemove: a member failed and removed can be added again at once, under its plain
// path, as a spare that is rebuilt into its role — also one that was opened as a faulty: or
// volatile: spec. Before, the removed member was still counted and AddSpare refused it as
// ErrDuplicateMember until the array was reassembled; a second open of its file would meet the
// lock the first still holds (ErrMemberBusy).
func TestAddAfterRemove(t *testing.T) {
	for _, spec := range []string{"", "faulty:", "volatile:"} {
		t.Run("as "+spec+"path", func(t *testing.T) {
			a, paths, model := newFileArray(t, t.TempDir(), 3, 64)
			if spec != "" {
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				var err error
				a, err = raid.Assemble([]string{paths[0], spec + paths[1], paths[2]}, raid.AssembleOptions{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { a.Close() })
			}
			failRemoveAddBack(t, a, paths[1])
			st := waitStatus(t, a, "the rebuild to finish", func(st raid.Status) bool {
				return st.LastRebuild != nil && st.Sync == nil && len(st.Missing) == 0
			})
			if state, role := memberState(st, paths[1]); state != raid.MemberActive || role != 1 {
				t.Errorf("re-added %s: %q in role %d, want active in role 1", paths[1], state, role)
			}
			compareArray(t, a, model)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			checkMembers(t, paths, a.Layout(), model, -1)
		})
	}
}

// TestAddForeignSuperblock: AddSpare and Replace refuse a path that carries another array's
// raid5d superblock (ErrInUse, as Create does), writing nothing to it and changing nothing in
// the array; with raid.Force they take it.
func TestAddForeignSuperblock(t *testing.T) {
	dir := t.TempDir()
	a, _, model := newFileArray(t, dir, 3, 64)
	other := []string{filepath.Join(dir, "x0.img"), filepath.Join(dir, "x1.img"), filepath.Join(dir, "x2.img")}
	b, err := raid.Create(other, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + 64*testChunk})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(other[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpare(other[0]); !errors.Is(err, raid.ErrInUse) {
		t.Errorf("AddSpare of another array's member: %v, want ErrInUse", err)
	}
	if err := a.Replace("0", other[0]); !errors.Is(err, raid.ErrInUse) {
		t.Errorf("Replace with another array's member: %v, want ErrInUse", err)
	}
	if after, err := os.ReadFile(other[0]); err != nil || !bytes.Equal(before, after) {
		t.Errorf("the refused member changed (%v)", err)
	}
	st := a.Status()
	if st.State == raid.StateDegraded || len(st.Members) != 3 {
		t.Fatalf("after the refusals: %v, %+v", st.State, st.Members)
	}
	if err := a.AddSpare(other[0], raid.Force); err != nil {
		t.Fatalf("AddSpare(Force) of another array's member: %v", err)
	}
	if state, role := memberState(a.Status(), other[0]); state != raid.MemberSpare || role != -1 {
		t.Errorf("forced spare: %q in role %d", state, role)
	}
	compareArray(t, a, model)
}

// TestAddBackHungMember: a member whose write hangs is failed, removed and added back while
// that write is still under way. The write holds its stripe's lock, so the rebuild onto the
// added-back file waits there until it lands and then writes the stripe's current chunk over
// it; a later write of the same range is not undone by it. Every byte reads back, and the
// member files check. (If a member write deadline ever let the caller, and the lock, go while
// the system call goes on, this would need AddSpare to wait for the member's writes.)
func TestAddBackHungMember(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a member that hangs for 1.5 s several times")
	}
	paths := memberPaths(t.TempDir(), 3)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + 64*testChunk,
		Consistency: raid.ConsistencyNone})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Every operation on member 1 sleeps first, then runs.
	const hang = 1500 * time.Millisecond
	a, err = raid.Assemble([]string{paths[0], "faulty:" + paths[1] + "?delay=" + hang.String(), paths[2]},
		raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1, MemberTimeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l := a.Layout()
	S := l.StripeSize()
	model := make([]byte, mustSize(a))
	fill(newRand(77), model[:S])
	if _, err := a.WriteAt(model[:S], 0); err != nil { // marks the array dirty first
		t.Fatal(err)
	}
	off := 5 * S
	fill(newRand(78), model[off:off+S])
	done := make(chan error, 1)
	// A full stripe (no reads): its member 1 write sleeps, holding stripe 5's lock.
	go func() { _, err := a.WriteAt(model[off:off+S], off); done <- err }()
	time.Sleep(hang / 5)
	failRemoveAddBack(t, a, paths[1])
	if len(done) > 0 {
		t.Fatalf("the hung write returned before the member was added back (%v): nothing was tested", <-done)
	}
	// The rebuild passes stripe 5 only once the hung write has landed; the newer write
	// after it must then survive.
	waitStatus(t, a, "the rebuild to finish", func(st raid.Status) bool {
		return st.LastRebuild != nil && st.Sync == nil && len(st.Missing) == 0
	})
	fill(newRand(79), model[off:off+S])
	if _, err := a.WriteAt(model[off:off+S], off); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the write that hung: %v", err)
	}
	time.Sleep(hang) // whatever member write was still asleep has landed by now
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, paths, l, model, -1)
}

// failRemoveAddBack fails member "1", removes it and adds its file, path, back as a spare.
func failRemoveAddBack(t *testing.T, a *raid.Array, path string) {
	t.Helper()
	if err := a.Fail("1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove("1"); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpare(path); err != nil {
		t.Fatalf("AddSpare of the removed member: %v", err)
	}
}
