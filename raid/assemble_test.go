package raid_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/raidtest"
	"github.com/raid5d/raid5d/stripe"
)

const testChunk = 4 << 10

// memberSize is the size of test members: room for 16 chunks of data.
const memberSize = raid.DataOffset + 16*testChunk

func newMems(prefix string, n int, size int64) []*raidtest.Mem {
	ms := make([]*raidtest.Mem, n)
	for i := range ms {
		ms[i] = raidtest.NewMem(fmt.Sprintf("%s%d", prefix, i), size)
	}
	return ms
}

func asMembers[M raid.Member](ms []M) []raid.Member {
	out := make([]raid.Member, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

// createMem creates a clean, closed array on n in-memory members and reopens them.
func createMem(t *testing.T, prefix string, n int) []*raidtest.Mem {
	t.Helper()
	ms := newMems(prefix, n, memberSize)
	createClosed(t, ms, raid.CreateOptions{Chunk: testChunk})
	return ms
}

// createClosed creates an array on the in-memory members ms with opts, closes it cleanly and
// reopens the members.
func createClosed(t *testing.T, ms []*raidtest.Mem, opts raid.CreateOptions) {
	t.Helper()
	a, err := raid.CreateMembers(asMembers(ms), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		m.Reopen()
	}
}

func clone(m *raidtest.Mem, name string) *raidtest.Mem {
	c := raidtest.NewMem(name, m.Size())
	copy(c.Bytes(), m.Bytes())
	return c
}

// cloneAll clones every member, as a crash leaves them, naming the copies prefix0, prefix1...
func cloneAll(ms []*raidtest.Mem, prefix string) []*raidtest.Mem {
	c := make([]*raidtest.Mem, len(ms))
	for i, m := range ms {
		c[i] = clone(m, fmt.Sprintf("%s%d", prefix, i))
	}
	return c
}

// editSuperblock changes a member's superblock in place and reseals its checksum.
func editSuperblock(m *raidtest.Mem, edit func(sb []byte)) {
	sb := m.Bytes()[raid.SuperblockOffset : raid.SuperblockOffset+raid.SuperblockSize]
	edit(sb)
	binary.LittleEndian.PutUint32(sb[raid.SuperblockSize-4:], crc32.Checksum(sb[:raid.SuperblockSize-4], crc32.MakeTable(crc32.Castagnoli)))
}

func TestAssembleRefusals(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T) []raid.Member
		want   error
		member string // the member the error must name ("" if none)
	}{
		{"member of another array", func(t *testing.T) []raid.Member {
			a, b := createMem(t, "a", 3), createMem(t, "b", 3)
			return []raid.Member{a[0], a[1], b[2]}
		}, raid.ErrForeignMember, "b2"},
		{"bad checksum", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 3)
			a[1].Bytes()[raid.SuperblockOffset+20] ^= 4
			return asMembers(a)
		}, raid.ErrChecksum, "a1"},
		{"bad magic", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 3)
			return []raid.Member{a[0], raidtest.NewMem("blank", memberSize), a[2]}
		}, raid.ErrBadMagic, "blank"},
		{"unsupported version", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 3)
			editSuperblock(a[2], func(sb []byte) { binary.LittleEndian.PutUint32(sb[8:], 99) })
			return asMembers(a)
		}, raid.ErrVersion, "a2"},
		{"duplicate role", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 4)
			return []raid.Member{a[0], a[1], clone(a[1], "copy-of-a1"), a[3]}
		}, raid.ErrDuplicateRole, "copy-of-a1"},
		{"stale member and another missing", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 3)
			// Run degraded without a2, write, close: a2 missed that. Without a1 too, a2
			// would be needed, and it is stale.
			arr, err := raid.AssembleMembers([]raid.Member{a[0], a[1]}, raid.AssembleOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := arr.WriteAt([]byte("missed"), 100); err != nil {
				t.Fatal(err)
			}
			arr.Close()
			a[0].Reopen()
			return []raid.Member{a[2], a[0]}
		}, raid.ErrStaleMember, ""},
		{"two members missing", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 4)
			return []raid.Member{a[3], a[1]}
		}, raid.ErrTooManyMissing, ""},
		{"geometry disagreement", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 3)
			editSuperblock(a[1], func(sb []byte) { binary.LittleEndian.PutUint64(sb[80:], 8*testChunk) }) // data size
			return asMembers(a)
		}, raid.ErrGeometry, "a1"},
		{"member shrank", func(t *testing.T) []raid.Member {
			a := createMem(t, "a", 3)
			small := raidtest.NewMem("small", memberSize-testChunk)
			copy(small.Bytes(), a[0].Bytes())
			return []raid.Member{small, a[1], a[2]}
		}, raid.ErrMemberTooSmall, "small"},
		{"no members", func(t *testing.T) []raid.Member { return nil }, raid.ErrNoMembers, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms := tt.setup(t)
			a, err := raid.AssembleMembers(ms, raid.AssembleOptions{})
			if err == nil {
				a.Close()
				t.Fatal("Assemble succeeded")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Assemble: %v, want %v", err, tt.want)
			}
			if tt.member != "" {
				var me *raid.MemberError
				if !errors.As(err, &me) || me.Member != tt.member {
					t.Fatalf("Assemble: %v; want a *MemberError naming %q", err, tt.member)
				}
			}
		})
	}
}

func TestAssembleFiles(t *testing.T) {
	dir := t.TempDir()
	paths := memberPaths(dir, 4)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("raid5d!"), 5000)
	if _, err := a.WriteAt(data, 777); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	t.Run("one path absent: degraded", func(t *testing.T) {
		var logs recorder
		ps := []string{paths[3], paths[1], dir + "/nonexistent", paths[0]}
		a, err := raid.Assemble(ps, raid.AssembleOptions{ReadOnly: true, Logger: slog.New(&logs)})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if st := a.Status(); st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != 2 || len(st.Members) != 3 {
			t.Fatalf("Status = %+v; want degraded, role 2 missing", st)
		}
		if logs.count(slog.LevelWarn) < 2 { // the absent path, and the degraded assembly
			t.Fatalf("got %d warnings, want at least 2", logs.count(slog.LevelWarn))
		}
		got := make([]byte, len(data))
		if _, err := a.ReadAt(got, 777); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("degraded read: %v, equal %v", err, bytes.Equal(got, data))
		}
	})
	t.Run("a spec of no registered kind: refused, not missing", func(t *testing.T) {
		// A typo'd URI (nbd:// is not even registered here) is no path: assembling degraded
		// without it, as for an absent file, would hide the typo until a second member fails.
		for _, readOnly := range []bool{true, false} {
			spec := "ndb://host/export"
			a, err := raid.Assemble([]string{paths[0], paths[1], spec, paths[3]}, raid.AssembleOptions{ReadOnly: readOnly})
			if err == nil {
				a.Close()
			}
			var uk *member.UnknownKindError
			if !errors.Is(err, raid.ErrUnknownMemberKind) || errors.Is(err, fs.ErrNotExist) || !errors.As(err, &uk) || uk.Spec != spec {
				t.Fatalf("Assemble (read-only %v) with %q: %v; want ErrUnknownMemberKind naming it", readOnly, spec, err)
			}
			if !slices.Contains(uk.Kinds, "faulty:") {
				t.Fatalf("the error lists the kinds %q, want the registered ones (faulty:)", uk.Kinds)
			}
		}
		var uk *member.UnknownKindError
		fresh := append(memberPaths(t.TempDir(), 3), "ndb://host/export")
		if _, err := raid.Create(fresh, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize}); !errors.As(err, &uk) {
			t.Fatalf("Create with a spec of no registered kind: %v, want an UnknownKindError", err)
		}
	})
	t.Run("two paths absent", func(t *testing.T) {
		_, err := raid.Assemble([]string{paths[0], paths[1], dir + "/x"}, raid.AssembleOptions{ReadOnly: true})
		if !errors.Is(err, raid.ErrTooManyMissing) {
			t.Fatalf("Assemble: %v, want ErrTooManyMissing", err)
		}
	})
	t.Run("same path twice", func(t *testing.T) {
		_, err := raid.Assemble([]string{paths[0], paths[1], paths[2], paths[0]}, raid.AssembleOptions{ReadOnly: true})
		if !errors.Is(err, raid.ErrDuplicateMember) {
			t.Fatalf("Assemble: %v, want ErrDuplicateMember", err)
		}
	})
	t.Run("same file as a path and a spec", func(t *testing.T) {
		_, err := raid.Assemble([]string{paths[0], paths[1], "volatile:" + paths[0]}, raid.AssembleOptions{ReadOnly: true})
		if !errors.Is(err, raid.ErrDuplicateMember) {
			t.Fatalf("Assemble: %v, want ErrDuplicateMember", err)
		}
	})
	t.Run("create over an array", func(t *testing.T) {
		_, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk})
		var me *raid.MemberError
		if !errors.Is(err, raid.ErrInUse) || !errors.As(err, &me) || me.Member != paths[0] {
			t.Fatalf("Create: %v, want ErrInUse naming %s", err, paths[0])
		}
	})
	t.Run("examine", func(t *testing.T) {
		rep, err := raid.Examine(append([]string{dir + "/nonexistent"}, paths[:3]...))
		if err != nil {
			t.Fatal(err)
		}
		if rep.State != raid.StateDegraded || !rep.Degraded() || len(rep.Missing) != 1 || rep.Missing[0] != 3 {
			t.Fatalf("Examine: state %v, missing %v; want degraded, [3]", rep.State, rep.Missing)
		}
		if !errors.Is(rep.Members[0].Err, os.ErrNotExist) || rep.Members[1].Role != 0 || rep.Members[3].Role != 2 {
			t.Fatalf("Examine members: %+v", rep.Members)
		}
		if rep.Layout.Members() != 4 || rep.Layout.ChunkSize() != testChunk || rep.Layout.Algorithm() != stripe.DefaultAlgorithm {
			t.Fatalf("Examine layout: %+v", rep.Layout)
		}
		if _, err := raid.Examine([]string{dir + "/nonexistent"}); !errors.Is(err, raid.ErrNoMembers) {
			t.Fatalf("Examine of nothing: %v, want ErrNoMembers", err)
		}
	})
	t.Run("force", func(t *testing.T) {
		a, err := raid.Create(paths, raid.CreateOptions{Chunk: 2 * testChunk, Force: true})
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		if _, err := a.ReadAt(got, 777); err != nil || !bytes.Equal(got, make([]byte, len(data))) {
			t.Fatalf("a new array must read as zeroes: %v", err)
		}
		a.Close()
	})
}

// TestCreateUnequal: members of unequal size contribute the smallest one's data area; a member
// too small for the array is refused, named.
func TestCreateUnequal(t *testing.T) {
	sizes := []int64{memberSize + 3*testChunk + 100, memberSize, memberSize + 9999}
	ms := make([]*raidtest.Mem, len(sizes))
	for i, s := range sizes {
		ms[i] = raidtest.NewMem(fmt.Sprint("u", i), s)
	}
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk, Layout: "ra"})
	if err != nil {
		t.Fatal(err)
	}
	size, _ := a.Size()
	if want := int64(16 * 2 * testChunk); size != want { // 16 stripes of 2 data chunks
		t.Fatalf("Size = %d, want %d", size, want)
	}
	if alg := a.Layout().Algorithm(); alg != stripe.RightAsymmetric {
		t.Fatalf("layout %v, want right-asymmetric", alg)
	}
	model := make([]byte, size)
	fill(newRand(1), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	compareArray(t, a, model)
	if _, err := a.WriteAt([]byte{1}, size); !errors.Is(err, raid.ErrOutOfRange) {
		t.Fatalf("write at the end: %v, want ErrOutOfRange", err)
	}
	a.Close()

	tiny := newMems("t", 3, raid.DataOffset+raid.MinDataChunks*testChunk)
	tiny[1] = raidtest.NewMem("tiny", raid.DataOffset+raid.MinDataChunks*testChunk-1)
	_, err = raid.CreateMembers(asMembers(tiny), raid.CreateOptions{Chunk: testChunk})
	var me *raid.MemberError
	if !errors.Is(err, raid.ErrMemberTooSmall) || !errors.As(err, &me) || me.Member != "tiny" {
		t.Fatalf("Create with a tiny member: %v, want ErrMemberTooSmall naming tiny", err)
	}
	for _, bad := range []struct {
		opts raid.CreateOptions
		want error
	}{
		{raid.CreateOptions{Chunk: 3000}, stripe.ErrChunk},
		{raid.CreateOptions{Layout: "diagonal"}, stripe.ErrAlgorithm},
	} {
		if _, err := raid.CreateMembers(asMembers(newMems("b", 3, memberSize)), bad.opts); !errors.Is(err, bad.want) {
			t.Fatalf("Create(%+v): %v, want %v", bad.opts, err, bad.want)
		}
	}
	if _, err := raid.CreateMembers(asMembers(newMems("b", 2, memberSize)), raid.CreateOptions{}); !errors.Is(err, stripe.ErrMembers) {
		t.Fatalf("Create with 2 members: %v, want stripe.ErrMembers", err)
	}
}

// TestCleanDirty follows the superblock state: clean after Create, dirty (durably, before the
// write) after the first write, clean after Close; an array not closed assembles as unclean,
// resyncs, and is clean after Close once the resync has finished.
func TestCleanDirty(t *testing.T) {
	dir := t.TempDir()
	paths := memberPaths(dir, 3)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize})
	if err != nil {
		t.Fatal(err)
	}
	examine := func() *raid.Report {
		t.Helper()
		rep, err := raid.Examine(paths)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := examine(); rep.State != raid.StateClean || rep.Dirty || a.Status().State != raid.StateClean {
		t.Fatalf("after Create: %v / %v, want clean", rep.State, a.Status().State)
	}
	ev0 := examine().Events
	if _, err := a.WriteAt([]byte("x"), 5); err != nil {
		t.Fatal(err)
	}
	rep := examine()
	if rep.State != raid.StateActive || !rep.Dirty || rep.Events != ev0+1 || a.Status().State != raid.StateActive {
		t.Fatalf("after a write: %v dirty=%v events %d→%d, status %v", rep.State, rep.Dirty, ev0, rep.Events, a.Status().State)
	}
	for _, m := range rep.Members {
		if !m.Dirty || m.Events != ev0+1 {
			t.Fatalf("member %s: dirty %v events %d", m.Path, m.Dirty, m.Events)
		}
	}
	if _, err := a.WriteAt([]byte("y"), 6); err != nil {
		t.Fatal(err)
	}
	if rep := examine(); rep.Events != ev0+1 {
		t.Fatalf("a second write changed the events counter: %d", rep.Events)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if rep := examine(); rep.State != raid.StateClean || rep.Events != ev0+2 {
		t.Fatalf("after Close: %v events %d, want clean %d", rep.State, rep.Events, ev0+2)
	}
	if err := a.Close(); !errors.Is(err, raid.ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}

	// A crash: written, never closed.
	a, err = raid.Assemble(paths, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt([]byte("z"), 7); err != nil {
		t.Fatal(err)
	}
	// Only flushed writes survive a crash: the stripe cache may still hold this one.
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	crashed := memberPaths(t.TempDir(), 3)
	for i := range paths {
		copyFile(t, paths[i], crashed[i])
	}
	a.Close()
	var logs recorder
	b, err := raid.Assemble(crashed, raid.AssembleOptions{Logger: slog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	if st := b.Status(); !st.Dirty || !st.Unclean || logs.count(slog.LevelWarn) != 1 {
		t.Fatalf("assembled after a crash: dirty %v unclean %v, %d warnings; want dirty, unclean, 1 warning", st.Dirty, st.Unclean, logs.count(slog.LevelWarn))
	}
	got := make([]byte, 3)
	if _, err := b.ReadAt(got, 5); err != nil || string(got) != "xyz" {
		t.Fatalf("read %q, %v", got, err)
	}
	p := waitResync(t, b)
	if p.Err != "" || p.Done != p.Total || b.Status().Unclean {
		t.Fatalf("resync: %+v, unclean %v", p, b.Status().Unclean)
	}
	b.Close()
	if r, err := raid.Examine(crashed); err != nil || r.Dirty {
		t.Fatalf("after the resync and Close the array must be clean: %+v, %v", r, err)
	}
}

// waitResync waits (at most 20 s) for a's resync to end and returns its progress.
func waitResync(t *testing.T, a *raid.Array) raid.Progress {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if st := a.Status(); st.LastResync != nil && st.Sync == nil {
			return *st.LastResync
		}
	}
	t.Fatalf("no resync ended: %+v", a.Status().Sync)
	return raid.Progress{}
}

func TestErrors(t *testing.T) {
	ms := newMems("e", 3, memberSize)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	size, _ := a.Size()
	type errnoer interface{ Errno() uint32 }
	errno := func(err error) uint32 {
		var e errnoer
		if !errors.As(err, &e) {
			return 0
		}
		return e.Errno()
	}
	const einval, eperm, eio, eshutdown = 22, 1, 5, 108
	buf := make([]byte, 10)
	ranges := []struct{ off, n int64 }{{-1, 10}, {size - 9, 10}, {size, 1}, {size + 100, 0}, {0, -1}, {1 << 62, 1 << 62}}
	for _, r := range ranges {
		if r.n >= 0 && r.n <= 10 {
			if n, err := a.ReadAt(buf[:r.n], r.off); n != 0 || !errors.Is(err, raid.ErrOutOfRange) || errno(err) != einval {
				t.Errorf("ReadAt(%d, %d) = %d, %v; want ErrOutOfRange (EINVAL)", r.off, r.n, n, err)
			}
			if n, err := a.WriteAt(buf[:r.n], r.off); n != 0 || !errors.Is(err, raid.ErrOutOfRange) {
				t.Errorf("WriteAt(%d, %d) = %d, %v; want ErrOutOfRange", r.off, r.n, n, err)
			}
		}
		if err := a.Trim(r.off, r.n); !errors.Is(err, raid.ErrOutOfRange) {
			t.Errorf("Trim(%d, %d): %v; want ErrOutOfRange", r.off, r.n, err)
		}
		if err := a.WriteZeroes(r.off, r.n, true); !errors.Is(err, raid.ErrOutOfRange) {
			t.Errorf("WriteZeroes(%d, %d): %v; want ErrOutOfRange", r.off, r.n, err)
		}
	}
	if n, err := a.ReadAt(buf[:0], size); n != 0 || err != nil {
		t.Errorf("empty read at the end: %d, %v", n, err)
	}
	a.Close()
	for _, m := range ms {
		m.Reopen()
	}

	// Read-only: EPERM, and nothing written.
	before := bytes.Clone(ms[0].Bytes())
	ro, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.WriteAt(buf, 0); !errors.Is(err, raid.ErrReadOnly) || errno(err) != eperm {
		t.Errorf("WriteAt on read-only: %v, want ErrReadOnly (EPERM)", err)
	}
	if err := ro.Trim(0, testChunk); !errors.Is(err, raid.ErrReadOnly) {
		t.Errorf("Trim on read-only: %v, want ErrReadOnly", err)
	}
	ro.Close()
	if !bytes.Equal(before, ms[0].Bytes()) {
		t.Error("a read-only array changed a member")
	}
	if _, err := ro.ReadAt(buf, 0); !errors.Is(err, raid.ErrClosed) || errno(err) != eshutdown {
		t.Errorf("ReadAt after Close: %v, want ErrClosed", err)
	}

	// Member faults: a failed read is served by reconstruction while the array is whole;
	// write errors and reads that cannot be rebuilt come back as *MemberError (EIO).
	for _, m := range ms {
		m.Reopen()
	}
	fs := make([]*raidtest.Faulty, 3)
	for i, m := range ms {
		fs[i] = raidtest.NewFaulty(m)
	}
	a, err = raid.AssembleMembers(asMembers(fs), raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	raid.StopBitmapCleaner(a) // its syncs would be counted
	data := make([]byte, 3*testChunk)
	fill(newRand(2), data)
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	loc := a.Layout().Map(testChunk) // second data chunk
	fs[loc.Member].Inject(raidtest.Fault{Op: raidtest.OpRead, Off: raid.DataOffset + loc.MemberOff, Len: 1})
	got := make([]byte, len(data))
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read with a failing member: %v (equal %v); want the data rebuilt", err, bytes.Equal(got, data))
	}
	fs[loc.Parity].Inject(raidtest.Fault{Op: raidtest.OpRead})
	n, err := a.ReadAt(got, 0)
	var me *raid.MemberError
	if !errors.Is(err, raidtest.ErrInjected) || !errors.As(err, &me) || errno(err) != eio || n != testChunk {
		t.Fatalf("read with two failing members: %d, %v; want %d and a *MemberError (EIO)", n, err, testChunk)
	}
	fs[loc.Parity].Clear()
	fs[loc.Member].Clear()
	// Nothing else may sync meanwhile: not the write-out of the half stripe written above
	// (its region's bit is synced to the members first), nor the bitmap's cleaner.
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	syncs, bitmapWrites := ms[1].Syncs(), a.Status().Bitmap.Flushes
	if _, err := a.WriteAtFUA(data[:10], 3); err != nil || ms[1].Syncs() != syncs+1 {
		t.Fatalf("WriteAtFUA: %v, syncs %d→%d (%d bitmap writes meanwhile)", err, syncs, ms[1].Syncs(), a.Status().Bitmap.Flushes-bitmapWrites)
	}
	// A failing write marks the member faulty; the write succeeds, degraded (failure_test.go).
	fs[loc.Member].Inject(raidtest.Fault{Op: raidtest.OpWrite, After: 0})
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatalf("write to a failing member: %v; want it done degraded", err)
	}
	if st := a.Status(); st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != loc.Member {
		t.Fatalf("after a failed write: %v, missing %v; want degraded, missing [%d]", st.State, st.Missing, loc.Member)
	}
}

// TestStripeLocks hammers the chunks of one stripe from one goroutine per chunk, each writing
// whole-chunk and sub-chunk pieces; parity must come out right.
func TestStripeLocks(t *testing.T) {
	ms := newMems("l", 5, memberSize)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, 4*testChunk)
	var wg sync.WaitGroup
	for d := range 4 {
		wg.Go(func() {
			rng := newRand(uint64(d))
			buf := make([]byte, testChunk)
			for range 200 {
				off := rng.Int64N(testChunk)
				n := 1 + rng.Int64N(testChunk-off)
				fill(rng, buf[:n])
				if _, err := a.WriteAt(buf[:n], int64(d)*testChunk+off); err != nil {
					t.Error(err)
					return
				}
				copy(model[int64(d)*testChunk+off:], buf[:n])
			}
		})
	}
	wg.Wait()
	compareArray(t, a, append(model, make([]byte, int(mustSize(a))-len(model))...))
	a.Close()
	paths := make([]string, len(ms))
	dir := t.TempDir()
	for i, m := range ms {
		paths[i] = fmt.Sprintf("%s/l%d", dir, i)
		if err := os.WriteFile(paths[i], m.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checkMembers(t, paths, a.Layout(), append(model, make([]byte, int(mustSize(a))-len(model))...), -1)
}

func mustSize(a *raid.Array) int64 { s, _ := a.Size(); return s }

// recorder is a slog.Handler that counts records by level.
type recorder struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.levels = append(r.levels, rec.Level)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }
func (r *recorder) count(l slog.Level) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.levels {
		if x == l {
			n++
		}
	}
	return n
}
