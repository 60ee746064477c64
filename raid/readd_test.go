package raid_test

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// bitmapBits returns the first bytes of the write-intent bitmap of the member file at path.
func bitmapBits(t *testing.T, path string, n int) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b[raid.BitmapOffset : raid.BitmapOffset+n]
}

// TestBitmapKeptWhileDegraded: a region written while a member is failed keeps its bit, on
// the members, through the cleaner, a clean Close and a degraded reassembly (md keeps them
// for --re-add); a region written while the array was whole is cleared as usual.
func TestBitmapKeptWhileDegraded(t *testing.T) {
	a, paths := createBitmapFiles(t)
	raid.StopBitmapCleaner(a)
	ss := a.Layout().StripeSize()
	if _, err := a.WriteAt([]byte("whole"), 1*ss); err != nil { // stripe 1: bit 1
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0)
	if err := a.Fail(paths[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt([]byte("degraded"), 3*ss+10); err != nil { // stripe 3: bit 3
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0)
	for _, p := range paths[:2] {
		if got := bitmapBits(t, p, 1)[0]; got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after the cleaner, degraded; want bit 3 only", p, got)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths[:2] {
		if got := bitmapBits(t, p, 1)[0]; got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after Close, degraded", p, got)
		}
	}
	b, err := raid.Assemble(paths[:2], raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	raid.StopBitmapCleaner(b)
	raid.CleanBitmap(b, 0)
	if st := b.Status(); st.Bitmap == nil || st.Bitmap.Set != 1 {
		t.Fatalf("reassembled degraded: bitmap %+v, want the one bit kept", st.Bitmap)
	}
	for _, p := range paths[:2] {
		if got := bitmapBits(t, p, 1)[0]; got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after a degraded reassembly and the cleaner", p, got)
		}
	}
}

// readdArray creates an array of 4 member files of chunks chunks in dir, 4 stripes per
// write-intent region, fills it with random data, flushes it and clears every bit (the
// background cleaner stopped, so that the tests decide when bits are cleared).
func readdArray(t *testing.T, dir string, chunks int64, opts raid.IOOptions) (*raid.Array, []string, []byte) {
	t.Helper()
	paths := memberPaths(dir, 4)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + chunks*testChunk,
		BitmapRegion: 4 * 3 * testChunk, IOOptions: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	raid.StopBitmapCleaner(a)
	model := writeModel(t, a, uint64(chunks))
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0)
	if st := a.Status(); st.Bitmap == nil || st.Bitmap.Set != 0 {
		t.Fatalf("after the fill and a clean: bitmap %+v", st.Bitmap)
	}
	return a, paths, model
}

// reAdded re-adds path and waits until it is active again; it returns the finished run.
func reAdded(t *testing.T, a *raid.Array, path string) raid.Progress {
	t.Helper()
	if err := a.ReAdd(path); err != nil {
		t.Fatalf("ReAdd(%s): %v", path, err)
	}
	st := waitStatus(t, a, "the re-added member active", func(st raid.Status) bool {
		s, _ := memberState(st, path)
		return s == raid.MemberActive && st.Sync == nil
	})
	if st.LastRebuild == nil || !st.LastRebuild.ReAdd || st.LastRebuild.Err != "" {
		t.Fatalf("last rebuild %+v, want a finished re-add", st.LastRebuild)
	}
	return *st.LastRebuild
}

// checkEachOut reads the whole array with each member but skip failed in turn (and re-added,
// which resyncs nothing: nothing was written meanwhile), comparing every byte with model.
func checkEachOut(t *testing.T, a *raid.Array, paths []string, skip int, model []byte) {
	t.Helper()
	got := make([]byte, len(model))
	for j, p := range paths {
		if j == skip {
			continue
		}
		raid.CleanBitmap(a, 0) // whole: what the last re-add resynced is clean now
		if err := a.Fail(p); err != nil {
			t.Fatal(err)
		}
		if _, err := a.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			i := firstDiff(got, model)
			t.Fatalf("with %s failed: byte %d differs (stripe %d)", p, i, int64(i)/a.Layout().StripeSize())
		}
		if p := reAdded(t, a, p); p.Resynced != 0 {
			t.Fatalf("re-adding %s, away with nothing written, resynced %d bytes", paths[j], p.Resynced)
		}
	}
}

// TestReAdd: a failed member re-added resyncs only the regions written while it was away (the
// bytes resynced are those regions' chunks), and then the array reads back byte for byte with
// each other member failed in turn, so the re-added member's data is right everywhere. The
// writes are partial (through the stripe cache's write-out) and one crosses two regions.
func TestReAdd(t *testing.T) {
	const chunks = 1024 // 1024 stripes, 256 regions of 4
	a, paths, model := readdArray(t, t.TempDir(), chunks, raid.IOOptions{})
	ss := a.Layout().StripeSize()
	region := 4 * ss
	if err := a.Fail(paths[1]); err != nil {
		t.Fatal(err)
	}
	writeSpans(t, a, model, newRand(7), []span{
		{10*region + 100, 300},          // region 10
		{100*region + ss - 10, ss},      // region 100, two stripes
		{202*region - 5000, 9000},       // regions 201 and 202
		{255*region + 3*ss, ss},         // region 255, its last stripe, whole
		{10*region + 2*ss + 7, 2 << 10}, // region 10 again
	}, func(int) {})
	raid.CleanBitmap(a, 0) // degraded: clears nothing
	if st := a.Status(); st.Bitmap.Set != 5 {
		t.Fatalf("%d bits set while degraded, want 5", st.Bitmap.Set)
	}
	p := reAdded(t, a, paths[1])
	if want := int64(5 * 4 * testChunk); p.Resynced != want || p.Done != p.Total {
		t.Fatalf("re-add resynced %d bytes (done %d of %d), want %d: the 5 regions' chunks only", p.Resynced, p.Done, p.Total, want)
	}
	raid.CleanBitmap(a, 0) // whole again: the bits go
	if st := a.Status(); st.Bitmap.Set != 0 {
		t.Fatalf("%d bits set after the re-add and a clean", st.Bitmap.Set)
	}
	// Read back from the members, not the cache (which holds the written stripes).
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := raid.Assemble(paths, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	raid.StopBitmapCleaner(b)
	checkEachOut(t, b, paths, 1, model)
}

// TestReAddVanished: a member missing at assembly (the array assembled degraded without it,
// written, closed and assembled again) is re-added by path: the bits survived both Closes.
func TestReAddVanished(t *testing.T) {
	dir := t.TempDir()
	a, paths, model := readdArray(t, dir, 256, raid.IOOptions{StripeCache: -1})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	open := func(ps []string) *raid.Array {
		b, err := raid.Assemble(ps, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		raid.StopBitmapCleaner(b)
		return b
	}
	b := open([]string{paths[0], paths[2], paths[3]})
	ss := b.Layout().StripeSize()
	w := model[20*4*ss : 20*4*ss+ss]
	fill(newRand(3), w)
	if _, err := b.WriteAt(w, 20*4*ss); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	c := open([]string{paths[0], paths[2], paths[3]})
	raid.CleanBitmap(c, 0)
	if p := reAdded(t, c, paths[1]); p.Resynced != 4*testChunk {
		t.Fatalf("resynced %d bytes, want one region's %d", p.Resynced, 4*testChunk)
	}
	checkEachOut(t, c, paths, 1, model)
}

// TestReAddRefused: ErrCannotReAdd, nothing changed, for a member of a whole array, another
// array's member, a copy of a member whose role is held, and a member whose events are older
// than the bitmap's last clear (its role was rebuilt onto a spare, which then failed: the
// bits of what it missed were cleared while the spare served). `add` still takes it.
func TestReAddRefused(t *testing.T) {
	dir := t.TempDir()
	spare := dir + "/spare.img"
	if err := os.WriteFile(spare, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a, paths, model := readdArray(t, dir, 64, raid.IOOptions{StripeCache: -1})
	if err := os.Truncate(spare, raid.DataOffset+64*testChunk); err != nil {
		t.Fatal(err)
	}
	refused := func(what, path string, also error) {
		t.Helper()
		before := a.Status()
		if err := a.ReAdd(path); !errors.Is(err, raid.ErrCannotReAdd) || also != nil && !errors.Is(err, also) {
			t.Fatalf("%s: ReAdd = %v, want ErrCannotReAdd (and %v)", what, err, also)
		}
		if st := a.Status(); st.State != before.State || len(st.Members) != len(before.Members) || st.Sync != nil {
			t.Fatalf("%s: refused, yet the array changed: %v %+v", what, st.State, st.Members)
		}
	}
	refused("an active member of a whole array", paths[2], nil)

	other := memberPaths(t.TempDir(), 4)
	o, err := raid.Create(other, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + 64*testChunk})
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	if err := a.Fail(paths[1]); err != nil {
		t.Fatal(err)
	}
	refused("a member of another array", other[1], raid.ErrForeignMember)

	img, err := os.ReadFile(paths[2])
	if err != nil {
		t.Fatal(err)
	}
	cp := dir + "/copy2.img"
	if err := os.WriteFile(cp, img, 0o600); err != nil {
		t.Fatal(err)
	}
	refused("a copy of role 2's member, role 2 being held", cp, nil)

	if err := a.AddSpare(spare); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the spare rebuilt", func(st raid.Status) bool {
		s, _ := memberState(st, spare)
		return s == raid.MemberActive && st.Sync == nil
	})
	if _, err := a.WriteAt(model[:100], 0); err != nil { // written with the spare in role 1
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0) // whole: cleared
	if err := a.Fail(spare); err != nil {
		t.Fatal(err)
	}
	refused("a member whose events are older than the bitmap's last clear", paths[1], raid.ErrStaleMember)
	if err := a.AddSpare(paths[1]); err != nil {
		t.Fatalf("add after the refused re-add: %v", err)
	}
	waitStatus(t, a, "the old member rebuilt fully", func(st raid.Status) bool {
		s, _ := memberState(st, paths[1])
		return s == raid.MemberActive && st.Sync == nil
	})
	if p := a.Status().LastRebuild; p.ReAdd || p.Resynced != p.Total {
		t.Fatalf("add rebuilt %+v, want a full rebuild", p)
	}
	got := make([]byte, len(model))
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("read back after the add: %v, equal %v", err, bytes.Equal(got, model))
	}
}

// TestReAddClose: Close in the middle of a re-add's resync leaves its record (position and
// map) in the superblocks; the next assembly continues the re-add from there, resyncing only
// the regions it had not, and every byte reads back with each other member failed in turn.
func TestReAddClose(t *testing.T) {
	dir := t.TempDir()
	opts := raid.IOOptions{StripeCache: -1, SyncSpeedMin: 64 << 10, SyncSpeedMax: 64 << 10}
	a, paths, model := readdArray(t, dir, 256, opts)
	if err := a.Fail(paths[3]); err != nil {
		t.Fatal(err)
	}
	ss := a.Layout().StripeSize()
	rng := newRand(11)
	for r := int64(0); r < 64; r += 2 { // every other region: 32 of 64
		p := model[r*4*ss+ss : r*4*ss+ss+ss/2]
		fill(rng, p)
		if _, err := a.WriteAt(p, r*4*ss+ss); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ReAdd(paths[3]); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the re-add under way", func(st raid.Status) bool {
		return st.Sync != nil && st.Sync.Resynced > 0
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	p := a.Status().LastRebuild
	if p == nil || !p.ReAdd || p.Done >= p.Total {
		t.Fatalf("stopped re-add %+v, want one part done", p)
	}
	b, err := raid.Assemble(paths, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	raid.StopBitmapCleaner(b)
	st := waitStatus(t, b, "the resumed rebuild finished", func(st raid.Status) bool {
		s, _ := memberState(st, paths[3])
		return s == raid.MemberActive && st.Sync == nil
	})
	// The re-add resumes as a re-add, where it stopped (its map in the superblocks), and
	// resyncs only what it had not: the two runs add up to the 32 regions' chunks.
	if r := st.LastRebuild; r == nil || !r.ReAdd || r.Resumed != p.Done || r.Err != "" ||
		p.Resynced+r.Resynced != 32*4*testChunk {
		t.Fatalf("resumed %+v after a re-add stopped at %d with %d bytes resynced; want a re-add from there, %d bytes in all",
			r, p.Done, p.Resynced, 32*4*testChunk)
	}
	checkEachOut(t, b, paths, 3, model)
}

// TestReAddAfterFailedReAdd: a member that fails during its re-add's resync (its superblock
// records the re-add) is re-added again, not refused: the bits kept while the role was away
// cover what it missed before the first re-add and since its second failure, and every byte
// reads back with each other member failed in turn. A spare that failed during a full rebuild
// is still refused (TestReAddRefused's kind of member, whole only below its position).
func TestReAddAfterFailedReAdd(t *testing.T) {
	dir := t.TempDir()
	opts := raid.IOOptions{StripeCache: -1, SyncSpeedMin: 64 << 10, SyncSpeedMax: 64 << 10}
	a, paths, model := readdArray(t, dir, 256, opts)
	ss := a.Layout().StripeSize()
	rng := newRand(12)
	write := func(r0 int64) { // every other region from r0: 32 of 64
		for r := r0; r < 64; r += 2 {
			p := model[r*4*ss+ss : r*4*ss+ss+ss/2]
			fill(rng, p)
			if _, err := a.WriteAt(p, r*4*ss+ss); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := a.Fail(paths[3]); err != nil {
		t.Fatal(err)
	}
	write(0)
	if err := a.ReAdd(paths[3]); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the re-add under way", func(st raid.Status) bool {
		return st.Sync != nil && st.Sync.Resynced > 0
	})
	if err := a.Fail(paths[3]); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the re-add stopped", func(st raid.Status) bool { return st.Sync == nil })
	if p := a.Status().LastRebuild; p == nil || !p.ReAdd || p.Done >= p.Total {
		t.Fatalf("stopped re-add %+v, want one part done", p)
	}
	write(1) // the other regions, while it is away again
	if err := a.SetSyncSpeed(1<<40, 1<<40); err != nil {
		t.Fatal(err)
	}
	if p := reAdded(t, a, paths[3]); p.Resynced > 64*4*testChunk {
		t.Fatalf("the second re-add resynced %d bytes, more than the 64 regions' chunks", p.Resynced)
	}
	checkEachOut(t, a, paths, 3, model)

	// A spare that fails during a full rebuild is still refused: it is whole only below its
	// position, which no bit covers.
	spare := dir + "/spare.img"
	if err := os.WriteFile(spare, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(spare, raid.DataOffset+256*testChunk); err != nil {
		t.Fatal(err)
	}
	if err := a.SetSyncSpeed(64<<10, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := a.Fail(paths[3]); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpare(spare); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the full rebuild under way", func(st raid.Status) bool {
		return st.Sync != nil && !st.Sync.ReAdd && st.Sync.Resynced > 0
	})
	if err := a.Fail(spare); err != nil {
		t.Fatal(err)
	}
	if err := a.ReAdd(spare); !errors.Is(err, raid.ErrCannotReAdd) {
		t.Fatalf("ReAdd of a spare failed during its full rebuild = %v, want ErrCannotReAdd", err)
	}
}
