package raid

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// TestReAddCrashKeepsResynced: a crash during a re-add keeps what the member holds below the
// position the re-add had reached. The re-add resyncs a window of regions (8 of them here), moves
// its position past it, then waits for its speed limit. A block written into the re-added role
// after that (the member written, since its stripe is below the position) and flushed must
// survive a crash that tears a write to another chunk of its stripe: the restart must take the
// member's chunk as it is, not rebuild it from the torn parity. Session 11's crash loop lost
// exactly such blocks: the position reached was not recorded before writes relied on it (the
// next checkpoint was a second away, the throttle's wait longer), so the restart resumed from 0
// and rebuilt the role from stripes torn at the kill.
func TestReAddCrashKeepsResynced(t *testing.T) {
	const (
		chunk   = 4 << 10
		stripes = 1024
		region  = 4 // stripes per bit
	)
	paths := rrFiles(t, 4)
	a, err := Create(paths, CreateOptions{Chunk: chunk, MemberSize: DataOffset + stripes*chunk,
		BitmapRegion: region * 3 * chunk,
		IOOptions:    IOOptions{SyncSpeedMin: 16 << 10, SyncSpeedMax: 16 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	a.bm.Stop()
	size, _ := a.Size()
	ss := a.layout.StripeSize()
	model := make([]byte, size)
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range model {
		model[i] = byte(rng.Uint32())
	}
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	a.bm.Clean(0)

	// Role 1 away while 10 regions far apart are written: more set runs than a re-add's window.
	const role = 1
	if err := a.Fail(paths[role]); err != nil {
		t.Fatal(err)
	}
	for i := range int64(10) {
		off := i * 20 * region * ss
		buf := model[off : off+ss]
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
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
	// The first window (8 of the 10 regions) resynced: the position has moved past it, and the
	// re-add waits for its speed limit (about 8 s for the window's 128 KiB) before the next.
	deadline := time.Now().Add(10 * time.Second)
	for a.roles.rebuildPos() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the re-add's position did not move in 10 s: %+v", a.Status().Sync)
		}
		time.Sleep(time.Millisecond)
	}
	pos := a.roles.rebuildPos()
	s := int64(20 * region) // region 20's first stripe: resynced, below the position
	if s >= pos {
		t.Fatalf("position %d after the first window, want it past stripe %d", pos, s)
	}
	// The block: role 1's chunk of stripe s, written and flushed with the member in place.
	d := a.layout.DataIndex(s, role)
	off := s*ss + int64(d)*chunk
	blk := model[off : off+chunk]
	for j := range blk {
		blk[j] = byte(rng.Uint32())
	}
	if _, err := a.WriteAt(blk, off); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if p := a.roles.rebuildPos(); p != pos {
		t.Fatalf("the re-add moved on (position %d, then %d) before the crash image was taken; the test needs it waiting", pos, p)
	}
	// The crash: the members as the kernel has them, with a write to another data chunk of
	// stripe s torn (its data reached its member, the parity did not).
	img := rrFiles(t, 4)
	rrCopy(t, paths, img)
	other := a.layout.DataMember(s, (d+1)%a.layout.DataMembers())
	torn := make([]byte, chunk)
	for j := range torn {
		torn[j] = byte(rng.Uint32())
	}
	f, err := os.OpenFile(img[other], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(torn, DataOffset+s*chunk); err != nil {
		t.Fatal(err)
	}
	f.Close()

	b := rrAssemble(t, img, rrFast)
	defer b.Close()
	got := make([]byte, chunk)
	if _, err := b.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, blk) {
		t.Fatalf("a flushed block of the re-added role (stripe %d, below the re-add's position %d) is wrong after the crash: recorded position %d",
			s, pos, rrSuperblocks(t, img)[0].Recovery/chunk)
	}
}
