package raid_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// wantBusy fails the test unless err is ErrMemberBusy naming this process as the holder (a
// second open file description conflicts with the first, even in one process).
func wantBusy(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, raid.ErrMemberBusy) {
		t.Fatalf("%s: %v, want ErrMemberBusy", what, err)
	}
	var be *raid.BusyError
	if !errors.As(err, &be) {
		t.Fatalf("%s: %v: no *BusyError", what, err)
	}
	if len(be.Holders) != 1 || be.Holders[0].PID != os.Getpid() {
		t.Fatalf("%s: holders %+v, want this process (pid %d): %v", what, be.Holders, os.Getpid(), err)
	}
}

// TestExclusiveUse: while an array is open, its members, spare and journal cannot be opened
// again for use, whichever way: a second Assemble (read-write or read-only), Create (even with
// Force), another array's AddSpare, OpenMember by path or through a volatile: spec. Each is
// refused with ErrMemberBusy naming the holder, before anything is written. Examine still reads
// the superblocks, and after Close the members can be assembled again.
func TestExclusiveUse(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	members := []string{file("m0"), file("m1"), file("m2")}
	spare, journal := file("spare"), file("journal")
	a, err := raid.Create(members, raid.CreateOptions{Chunk: testChunk, MemberSize: 8 << 20, Spares: []string{spare},
		Consistency: raid.ConsistencyJournal, JournalPath: journal, JournalSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	uuid := a.Status().UUID
	all := append(members[:3:3], spare)

	_, err = raid.Assemble(all, raid.AssembleOptions{})
	wantBusy(t, "second Assemble", err)
	_, err = raid.Assemble(all, raid.AssembleOptions{ReadOnly: true})
	wantBusy(t, "read-only Assemble", err)
	for _, p := range []string{members[1], spare, journal, "volatile:" + members[2], "faulty:" + spare + "?after=5"} {
		for _, ro := range []bool{false, true} {
			m, err := raid.OpenMember(p, ro)
			if err == nil {
				m.Close()
			}
			wantBusy(t, "OpenMember "+p, err)
		}
	}
	fresh := []string{file("n1"), file("n2")}
	_, err = raid.Create(append([]string{members[0]}, fresh...), raid.CreateOptions{Chunk: testChunk, MemberSize: 8 << 20, Force: true})
	wantBusy(t, "Create --force on a member in use", err)
	for _, p := range fresh {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused Create left %s behind (%v)", p, err)
		}
	}
	_, err = raid.Create([]string{file("o0"), file("o1"), file("o2")}, raid.CreateOptions{Chunk: testChunk, MemberSize: 8 << 20,
		Consistency: raid.ConsistencyJournal, JournalPath: journal})
	wantBusy(t, "Create with the journal in use", err)

	b, err := raid.Create([]string{file("b0"), file("b1"), file("b2")}, raid.CreateOptions{Chunk: testChunk, MemberSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, p := range []string{spare, members[0], journal} {
		wantBusy(t, "AddSpare of another array's "+p, b.AddSpare(p))
	}
	if n := len(b.Status().Members); n != 3 {
		t.Fatalf("the other array has %d members after refused adds, want 3", n)
	}

	rep, err := raid.Examine(all)
	if err != nil {
		t.Fatalf("Examine of members in use: %v", err)
	}
	if rep.UUID != uuid || len(rep.Missing) != 0 {
		t.Fatalf("Examine: UUID %s missing %v, want %s and none (Create --force must not have written)", rep.UUID, rep.Missing, uuid)
	}
	for _, em := range rep.Members {
		if em.Err != nil {
			t.Fatalf("Examine %s: %v", em.Path, em.Err)
		}
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a2, err := raid.Assemble(all, raid.AssembleOptions{})
	if err != nil {
		t.Fatalf("Assemble after Close: %v", err)
	}
	if err := a2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSharedReadOnly: read-only assemblies of one array share its members; a read-write one is
// refused while any of them is open, and a read-only one while a read-write one is.
func TestSharedReadOnly(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")}
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	r1, err := raid.Assemble(paths, raid.AssembleOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := raid.Assemble(paths, raid.AssembleOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("second read-only Assemble: %v", err)
	}
	_, err = raid.Assemble(paths, raid.AssembleOptions{})
	wantBusy(t, "read-write Assemble beside read-only ones", err)
	r1.Close()
	r2.Close()
}

// TestCreateFileModes: the member, spare and journal files Create makes are mode 0600 whatever
// the umask: they hold the array's data.
func TestCreateFileModes(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")}
	spare, journal := filepath.Join(dir, "spare"), filepath.Join(dir, "journal")
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: 8 << 20, Spares: []string{spare},
		Consistency: raid.ConsistencyJournal, JournalPath: "volatile:" + journal, JournalSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, p := range append(paths, spare, journal) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
}
