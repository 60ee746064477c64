package raid

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// TestReAddCrashKeepsResynced: a crash during a re-add loses no flushed block of the re-added
// role: one written and flushed, then a write to another chunk of its stripe torn by the crash
// (its data on its member, the parity not). The restart must take the member's chunk as it
// is, not rebuild it from the torn parity, so the member must have been written and the
// superblocks must say it is whole there. Three places: a region written while the member was
// away, once the re-add has resynced it ("resynced"); a region not written meanwhile, where
// the member is whole from the start ("clean"); and a region written meanwhile and not yet
// resynced ("stale"), where the write must wait for the re-add to resync it first: written
// without the member, a torn stripe there could not be repaired. Session 11's crash loop lost
// such blocks: the superblocks recorded only a position, written a second or more after the
// member was served past it, a restart rebuilt everything above it from parity, and writes
// above it left the member out.
func TestReAddCrashKeepsResynced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		region int64 // the block's region (4 stripes each)
	}{
		{"resynced", 20},
		{"clean", 230},
		{"stale", 180},
	} {
		t.Run(tc.name, func(t *testing.T) { readdCrash(t, tc.name, tc.region) })
	}
}

func readdCrash(t *testing.T, kind string, region int64) {
	const (
		chunk   = 4 << 10
		stripes = 1024
		rs      = 4 // stripes per region
	)
	paths := rrFiles(t, 4)
	a, err := Create(paths, CreateOptions{Chunk: chunk, MemberSize: DataOffset + stripes*chunk,
		BitmapRegion: rs * 3 * chunk,
		IOOptions:    IOOptions{SyncSpeedMin: 16 << 10, SyncSpeedMax: 16 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	a.bm.Stop()
	ss := a.layout.StripeSize()
	model, fill := crashModel(t, a, rand.New(rand.NewPCG(11, uint64(region))))
	a.bm.Clean(0)

	// Role 1 away while 10 regions far apart (0, 20, ..., 180) are written; the re-add
	// resyncs them at 16 KiB/s, about a second each.
	const role = 1
	if err := a.Fail(paths[role]); err != nil {
		t.Fatal(err)
	}
	for i := range int64(10) {
		off := i * 20 * rs * ss
		buf := model[off : off+ss]
		fill(buf)
		if _, err := a.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.ReAdd(paths[role]); err != nil {
		t.Fatal(err)
	}
	s := region * rs
	switch kind {
	case "resynced":
		deadline := time.Now().Add(20 * time.Second)
		for !a.roles.isRebuilt(s) {
			if time.Now().After(deadline) {
				t.Fatalf("the re-add did not resync stripe %d in 20 s: %+v", s, a.Status().Sync)
			}
			time.Sleep(time.Millisecond)
		}
	case "clean":
		if !a.roles.isRebuilt(s) {
			t.Fatalf("stripe %d, in a region not written while the member was away, is not served by it after the re-add", s)
		}
	case "stale":
		if a.roles.isRebuilt(s) {
			t.Fatalf("stripe %d, the last region written while the member was away, served by it right after the re-add: the test needs it not resynced yet", s)
		}
	}
	// The block: role 1's chunk of stripe s, written and flushed with the member in place.
	d := a.layout.DataIndex(s, role)
	off := s*ss + int64(d)*chunk
	blk := model[off : off+chunk]
	fill(blk)
	if _, err := a.WriteAt(blk, off); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if !a.roles.isRebuilt(s) {
		t.Fatalf("stripe %d written (and flushed) without the re-added member", s)
	}
	// The crash: the members as the kernel has them, with a write to another data chunk of
	// stripe s torn (its data reached its member, the parity did not). The files are copied
	// one after another: every stripe's lock is held meanwhile, so that the re-add is not in
	// the middle of a piece (whose data and record would then be copied from different
	// moments, as no crash can leave them).
	img := rrFiles(t, 4)
	a.locks.LockSpan(0, stripes)
	rrCopy(t, paths, img)
	a.locks.UnlockSpan(0, stripes)
	if st := a.Status(); st.Sync == nil || st.Sync.Kind != "rebuild" {
		t.Fatalf("the re-add ended before the crash image was taken (%+v): the test needs it under way", st.Sync)
	}
	torn := make([]byte, chunk)
	fill(torn)
	b, got := crashTornRead(t, a, img, s, d, torn, off)
	defer b.Close()
	if !bytes.Equal(got, blk) {
		sb := rrSuperblocks(t, img)[0]
		t.Fatalf("a flushed block of the re-added role (stripe %d) is wrong after the crash: recorded position %d, re-add record %v",
			s, sb.Recovery/chunk, sb.ReAdd != nil)
	}
	// The restart resumes the re-add, and then every stripe but the torn one reads back.
	st := waitStatusInternal(t, b, func(st Status) bool { return st.Sync == nil })
	if r := st.LastRebuild; r == nil || !r.ReAdd || r.Err != "" {
		t.Fatalf("after the restart: last rebuild %+v, want the re-add resumed and finished", r)
	}
	checkAllButStripe(t, b, model, s, "after the resumed re-add")
}

// crashModel fills all of a from rng, flushed, and returns what it wrote and the filler, for
// more blocks from the same rng.
func crashModel(t *testing.T, a *Array, rng *rand.Rand) ([]byte, func([]byte)) {
	t.Helper()
	fill := func(p []byte) {
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
	}
	size, _ := a.Size()
	model := make([]byte, size)
	fill(model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	return model, fill
}

// crashTornRead tears, in img (a crash image of a's members), a write to the data chunk after
// the d-th of stripe s: torn reached that chunk's member, the parity did not. It then
// assembles the image and reads len(torn) bytes at off; the caller closes the array.
func crashTornRead(t *testing.T, a *Array, img []string, s int64, d int, torn []byte, off int64) (*Array, []byte) {
	t.Helper()
	other := a.layout.DataMember(s, (d+1)%a.layout.DataMembers())
	f, err := os.OpenFile(img[other], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(torn, DataOffset+s*int64(len(torn))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b := rrAssemble(t, img, rrFast)
	got := make([]byte, len(torn))
	if _, err := b.ReadAt(got, off); err != nil {
		b.Close()
		t.Fatal(err)
	}
	return b, got
}

// checkAllButStripe reads all of b and compares it with model, but for stripe s (torn).
func checkAllButStripe(t *testing.T, b *Array, model []byte, s int64, when string) {
	t.Helper()
	ss := b.layout.StripeSize()
	all := make([]byte, len(model))
	if _, err := b.ReadAt(all, 0); err != nil {
		t.Fatal(err)
	}
	for i := range model {
		if int64(i)/ss != s && all[i] != model[i] {
			t.Fatalf("%s: byte %d (stripe %d) differs", when, i, int64(i)/ss)
		}
	}
}

// waitStatusInternal polls a's status until cond holds (10 s at most).
func waitStatusInternal(t *testing.T, a *Array, cond func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := a.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("status did not settle in 10 s: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
