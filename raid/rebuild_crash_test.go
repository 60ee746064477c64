package raid

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRebuildCrashKeepsRebuilt: a crash during a full rebuild onto a spare loses no flushed
// block of the rebuilt role below the rebuild position. The block is written and flushed once
// the rebuild has passed its stripe (so the spare is written as a member there), then a write
// to another chunk of its stripe is torn by the crash (its data on its member, the parity
// not). The restart must take the spare's chunk as it is, not rebuild it from the torn
// parity, so the superblocks must already record a position past the stripe. The rebuild
// records its position only each second: the write records it first (recordBefore). Before
// session 13 nothing did, and the restart rebuilt the block from the torn stripe.
//
// The block reaches the members by each path that writes them: WriteAt (into the cache,
// written out by the Flush), WriteCached (into the cache, written out by the background
// writer: the member writes come long after the call, which checks nothing) and a placed
// write of the whole stripe (PlaceWrite, which must decline in the unrecorded window and
// leave the write to WriteAt, as the NBD server does).
func TestRebuildCrashKeepsRebuilt(t *testing.T) {
	for _, via := range []string{"WriteAt", "WriteCached", "PlaceWrite"} {
		t.Run(via, func(t *testing.T) { testRebuildCrashKeepsRebuilt(t, via) })
	}
}

func testRebuildCrashKeepsRebuilt(t *testing.T, via string) {
	const (
		chunk   = 4 << 10
		stripes = 1024
		role    = 1
	)
	paths := rrFiles(t, 4)
	a, err := Create(paths, CreateOptions{Chunk: chunk, MemberSize: DataOffset + stripes*chunk,
		IOOptions: IOOptions{SyncSpeedMin: 1, SyncSpeedMax: 1, WriteBackDelay: time.Millisecond,
			MappedWrites: via == "PlaceWrite"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	ss := a.layout.StripeSize()
	model, fill := crashModel(t, a, rand.New(rand.NewPCG(13, 1)))
	if err := a.Fail(paths[role]); err != nil {
		t.Fatal(err)
	}
	// The spare: the rebuild does its first batch, then the throttle (1 byte/s) holds it.
	spare := filepath.Join(filepath.Dir(paths[0]), "spare.img")
	if err := os.WriteFile(spare, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(spare, DataOffset+stripes*chunk); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpare(spare); err != nil {
		t.Fatal(err)
	}
	batch := a.syncBatch()
	st := waitStatusInternal(t, a, func(st Status) bool {
		return st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Done >= batch*chunk
	})
	if st.Sync.Done != batch*chunk {
		t.Fatalf("the rebuild went past its first batch (%d bytes): the test needs it held", st.Sync.Done)
	}
	// The block: role 1's chunk of stripe s, in the first batch, written and flushed with the
	// spare in place.
	s := batch / 2
	if !a.roles.isRebuilt(s) {
		t.Fatalf("stripe %d not served by the spare after the first batch", s)
	}
	if !a.roles.unrecorded(s, 1) {
		t.Fatalf("stripe %d already recorded (position %d): the test needs it served only", s, a.roles.recorded.Load())
	}
	d := a.layout.DataIndex(s, role)
	off := s*ss + int64(d)*chunk
	blk := model[off : off+chunk]
	switch via {
	case "WriteAt":
		fill(blk)
		if _, err := a.WriteAt(blk, off); err != nil {
			t.Fatal(err)
		}
	case "WriteCached":
		fill(blk)
		if !a.WriteCached(blk, off, nil) {
			t.Fatal("WriteCached declined the block")
		}
		// Written out by the background writer (a millisecond's delay), under the lock.
		for deadline := time.Now().Add(10 * time.Second); a.cache.Dirty(s, 1); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the block was not written out in 10 s")
			}
		}
		a.locks.LockSpan(s, 1)
		a.locks.UnlockSpan(s, 1) // the write-out that cleared the head has ended
	case "PlaceWrite":
		p := model[s*ss : (s+1)*ss]
		fill(p)
		placeOrWrite(t, a, p, s*ss)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	// The crash image, copied with every stripe lock held, with a write to another data
	// chunk of stripe s torn: its data reached its member, the parity did not.
	live := []string{paths[0], spare, paths[2], paths[3]}
	img := rrFiles(t, 4)
	a.locks.LockSpan(0, stripes)
	rrCopy(t, live, img)
	a.locks.UnlockSpan(0, stripes)
	if via == "PlaceWrite" && !placeOrWrite(t, a, model[s*ss:(s+1)*ss], s*ss) {
		// Recorded now: the stripe is placed, so the decline above was the window's.
		t.Fatal("PlaceWrite declined the stripe after its position was recorded")
	}
	torn := make([]byte, chunk)
	fill(torn)
	b, got := crashTornRead(t, a, img, s, d, torn, off)
	defer b.Close()
	if !bytes.Equal(got, blk) {
		sb := rrSuperblocks(t, img)[0]
		t.Fatalf("a flushed block of the rebuilt role (stripe %d, below the rebuild position %d) is wrong after the crash: recorded position %d",
			s, batch, sb.Recovery/chunk)
	}
	// The restart resumes the rebuild, and then every stripe but the torn one reads back.
	st = waitStatusInternal(t, b, func(st Status) bool { return st.Sync == nil })
	if r := st.LastRebuild; r == nil || r.Err != "" {
		t.Fatalf("after the restart: last rebuild %+v, want it resumed and finished", r)
	}
	checkAllButStripe(t, b, model, s, "after the resumed rebuild")
}

// placeOrWrite writes p at off as a placed write (PlaceWrite, CommitPlaced) or, if the array
// declines it, with WriteAt, as the NBD server does; it reports whether p was placed.
func placeOrWrite(t *testing.T, a *Array, p []byte, off int64) bool {
	t.Helper()
	v, h, ok := a.PlaceWrite(off, len(p), nil)
	if !ok {
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		return false
	}
	n := 0
	for _, b := range v {
		n += copy(b, p[n:])
	}
	if err := a.CommitPlaced(h, n, true); err != nil {
		t.Fatal(err)
	}
	return true
}
