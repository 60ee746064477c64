package raid

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Geometry of the resume tests: 3 members of 2 MiB of data at 4 KiB chunks (512 stripes,
// regions of 8), resynced at 512 KiB/s (about 4 s for the whole array) while the test wants
// it slow, unthrottled when it wants it done.
const (
	rrChunk   = 4 << 10
	rrStripes = 512
	rrSlow    = 512 << 10
	rrFast    = 1 << 40
)

// rrFiles returns n member paths in a new directory.
func rrFiles(t *testing.T, n int) []string {
	dir := t.TempDir()
	ps := make([]string, n)
	for i := range ps {
		ps[i] = filepath.Join(dir, fmt.Sprintf("m%d.img", i))
	}
	return ps
}

// rrCopy copies the member files from to to (a crash image when the array is running).
func rrCopy(t *testing.T, from, to []string) {
	t.Helper()
	for i := range from {
		b, err := os.ReadFile(from[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to[i], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// rrAssemble assembles the array at paths with the sync speed limited to speed bytes/s.
func rrAssemble(t *testing.T, paths []string, speed int64) *Array {
	t.Helper()
	a, err := Assemble(paths, AssembleOptions{IOOptions: IOOptions{SyncSpeedMin: speed, SyncSpeedMax: speed}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// rrSuperblocks reads the superblocks of the members at paths (without a lock, as Examine).
func rrSuperblocks(t *testing.T, paths []string) []*superblock {
	t.Helper()
	sbs := make([]*superblock, len(paths))
	for i, p := range paths {
		m, err := openMember(p, useInspect)
		if err != nil {
			t.Fatal(err)
		}
		sbs[i], err = readSuperblock(m)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return sbs
}

// rrMismatches returns the stripes of the closed members at paths whose parity chunk is not,
// byte for byte, the XOR of their data chunks.
func rrMismatches(t *testing.T, a *Array, paths []string) []int64 {
	t.Helper()
	l := a.Layout()
	files := make([][]byte, len(paths))
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = b
	}
	P := make([]byte, rrChunk)
	var bad []int64
	for s := range int64(rrStripes) {
		off := DataOffset + s*rrChunk
		clear(P)
		for d := range l.DataMembers() {
			subtle.XORBytes(P, P, files[l.DataMember(s, d)][off:off+rrChunk])
		}
		if !bytes.Equal(P, files[l.ParityMember(s)][off:off+rrChunk]) {
			bad = append(bad, s)
		}
	}
	return bad
}

// rrFlipParity flips a byte of stripe s's parity chunk in the closed members at paths.
func rrFlipParity(t *testing.T, a *Array, paths []string, s int64) {
	t.Helper()
	f, err := os.OpenFile(paths[a.Layout().ParityMember(s)], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	off := DataOffset + s*rrChunk + 123
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// rrWaitDone waits (at most 20 s) until the running resync has done at least n bytes.
func rrWaitDone(t *testing.T, a *Array, n int64) Progress {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if p := a.Status().Sync; p != nil && p.Kind == "resync" && p.Done >= n {
			return *p
		}
	}
	t.Fatalf("the resync did not reach %d bytes: %+v", n, a.Status().Sync)
	return Progress{}
}

// rrWaitEnd waits (at most 20 s) for the resync to end and returns its progress.
func rrWaitEnd(t *testing.T, a *Array) Progress {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if st := a.Status(); st.LastResync != nil && st.Sync == nil {
			return *st.LastResync
		}
	}
	t.Fatalf("the resync did not end: %+v", a.Status().Sync)
	return Progress{}
}

// rrWrite writes random blocks at random offsets of a (and want), one in each eighth of
// the array, so that some land below the resync's position and some above; none touches
// the stripes in avoid (whose parity the test corrupted: a write could repair it).
func rrWrite(t *testing.T, a *Array, want []byte, rng *rand.Rand, avoid ...int64) {
	t.Helper()
	n, ss := int64(len(want)), a.Layout().StripeSize()
	for i := range int64(8) {
		p := make([]byte, 1+rng.IntN(3*rrChunk))
		for j := range p {
			p[j] = byte(rng.Uint32())
		}
		off := i*n/8 + rng.Int64N(n/8-int64(len(p)))
		for _, s := range avoid {
			if off < (s+1)*ss && off+int64(len(p)) > s*ss {
				off = s*ss - int64(len(p)) // just before it (the stripes avoided are far apart)
			}
		}
		copy(want[off:], p)
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
}

// rrCheckData compares every byte of a with want.
func rrCheckData(t *testing.T, a *Array, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("array data differs from what was written, first at byte %d", i)
	}
}

// TestResyncResume: a full resync (no bitmap) that Close stops in the middle records its
// position in the superblocks, still dirty; the next assembly clears it and resumes there:
// a parity corrupted behind the array's back below the position stays wrong (the resumed
// resync did not go back over it), one above is fixed, and the resumed run reads only what
// was left. A crash during the resumed resync (superblocks copied while it runs) restarts
// the next resync at stripe 0, which fixes the stripe below the old position too. Data
// written throughout reads back byte for byte, and parity is checked on every stripe.
func TestResyncResume(t *testing.T) {
	paths := rrFiles(t, 3)
	a, err := Create(paths, CreateOptions{Chunk: rrChunk, MemberSize: DataOffset + rrStripes*rrChunk, Consistency: ConsistencyNone})
	if err != nil {
		t.Fatal(err)
	}
	size, _ := a.Size()
	memberData := int64(rrStripes * rrChunk)
	want := make([]byte, size)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	if _, err := a.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	// The crash: the members as they are, dirty.
	img := rrFiles(t, 3)
	rrCopy(t, paths, img)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	// 1. The resync after the crash, stopped cleanly at about a quarter.
	b := rrAssemble(t, img, rrSlow)
	rrWrite(t, b, want, rng)
	p := rrWaitDone(t, b, memberData/4)
	if p.Resumed != 0 {
		t.Fatalf("first resync after the crash: %+v, want it to start at 0", p)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	stop := rrSuperblocks(t, img)[0].Resync
	for i, sb := range rrSuperblocks(t, img) {
		if !sb.Dirty || sb.Resync != stop {
			t.Fatalf("member %d after Close stopped the resync: dirty %v, resync %d; want dirty, %d", i, sb.Dirty, sb.Resync, stop)
		}
	}
	if stop < memberData/4 || stop >= memberData || stop%rrChunk != 0 {
		t.Fatalf("recorded resync position %d, want a chunk multiple in [%d, %d)", stop, memberData/4, memberData)
	}
	if bad := rrMismatches(t, b, img); len(bad) != 0 {
		t.Fatalf("stripes inconsistent after the clean stop: %v", bad)
	}
	below, above := stop/rrChunk/2, (stop/rrChunk+rrStripes)/2
	rrFlipParity(t, b, img, below)
	rrFlipParity(t, b, img, above)
	// For the crash variant below: the same members, stopped at the same place.
	img2 := rrFiles(t, 3)
	rrCopy(t, img, img2)
	want2 := bytes.Clone(want)

	// 2. Resumed: it starts at the recorded position and finishes.
	c := rrAssemble(t, img, rrSlow)
	if p := rrWaitDone(t, c, stop); p.Resumed != stop || !c.Status().Unclean {
		t.Fatalf("after the clean stop: sync %+v, unclean %v; want a resync resumed from %d", p, c.Status().Unclean, stop)
	}
	for i, sb := range rrSuperblocks(t, img) {
		if sb.Resync != 0 || !sb.Dirty {
			t.Fatalf("member %d while the resumed resync runs: resync %d, dirty %v; want 0, dirty", i, sb.Resync, sb.Dirty)
		}
	}
	rrWrite(t, c, want, rng, below, above)
	if err := c.Flush(); err != nil { // no member reads of the cache's after read0
		t.Fatal(err)
	}
	read0 := c.Counters().MemberBytesRead
	if err := c.SetSyncSpeed(rrFast, rrFast); err != nil {
		t.Fatal(err)
	}
	p = rrWaitEnd(t, c)
	if p.Err != "" || p.Resumed != stop || p.Done != memberData || p.Total != memberData ||
		p.Mismatches != 1 || len(p.MismatchAt) != 1 || p.MismatchAt[0] != above {
		t.Fatalf("resumed resync: %+v; want resumed from %d, done, stripe %d fixed", p, stop, above)
	}
	// It read no member byte below where it resumed (nothing else reads meanwhile).
	if read := c.Counters().MemberBytesRead - read0; read > uint64(3*(memberData-stop)) {
		t.Fatalf("the resumed resync read %d member bytes, at most %d are left above %d", read, 3*(memberData-stop), stop)
	}
	if st := c.Status(); st.Unclean {
		t.Fatal("still unclean after the resumed resync finished")
	}
	rrCheckData(t, c, want)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if bad := rrMismatches(t, c, img); len(bad) != 1 || bad[0] != below {
		t.Fatalf("inconsistent stripes after the resumed resync: %v, want only %d (corrupted below the resume point, never revisited)", bad, below)
	}
	for i, sb := range rrSuperblocks(t, img) {
		if sb.Dirty || sb.Resync != 0 {
			t.Fatalf("member %d after the resync and Close: dirty %v, resync %d; want clean", i, sb.Dirty, sb.Resync)
		}
	}

	// 3. The crash variant: it resumes, then crashes; the next resync starts at 0.
	d := rrAssemble(t, img2, rrSlow)
	if p := rrWaitDone(t, d, stop); p.Resumed != stop {
		t.Fatalf("second copy: sync %+v, want a resync resumed from %d", p, stop)
	}
	rrWrite(t, d, want2, rng, below, above)
	rrWaitDone(t, d, stop+memberData/8)
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	crashed := rrFiles(t, 3)
	rrCopy(t, img2, crashed)
	d.Close()
	for i, sb := range rrSuperblocks(t, crashed) {
		if !sb.Dirty || sb.Resync != 0 {
			t.Fatalf("member %d crashed during the resumed resync: dirty %v, resync %d; want dirty, no resume point", i, sb.Dirty, sb.Resync)
		}
	}
	e := rrAssemble(t, crashed, rrFast)
	p = rrWaitEnd(t, e)
	if p.Err != "" || p.Resumed != 0 || p.Done != memberData || p.Total != memberData || p.Mismatches < 1 || p.MismatchAt[0] != below {
		t.Fatalf("resync after a crash of the resumed one: %+v; want it from 0, fixing stripe %d", p, below)
	}
	rrCheckData(t, e, want2)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if bad := rrMismatches(t, e, crashed); len(bad) != 0 {
		t.Fatalf("inconsistent stripes after the full resync: %v", bad)
	}
}

// TestResyncResumeReadOnly: a read-only assembly of an array with a resume point leaves the
// point on the members (it writes nothing), and the array resumes from it afterwards.
func TestResyncResumeReadOnly(t *testing.T) {
	paths := rrFiles(t, 3)
	a, err := Create(paths, CreateOptions{Chunk: rrChunk, MemberSize: DataOffset + rrStripes*rrChunk, Consistency: ConsistencyNone})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	img := rrFiles(t, 3)
	rrCopy(t, paths, img)
	a.Close()
	b := rrAssemble(t, img, rrSlow)
	rrWaitDone(t, b, rrStripes*rrChunk/8)
	b.Close()
	stop := rrSuperblocks(t, img)[0].Resync
	if stop == 0 {
		t.Fatal("no resume point recorded")
	}
	r, err := Assemble(img, AssembleOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if got := rrSuperblocks(t, img)[0].Resync; got != stop {
		t.Fatalf("after a read-only assembly the resume point is %d, want %d", got, stop)
	}
	c := rrAssemble(t, img, rrFast)
	if p := rrWaitEnd(t, c); p.Resumed != stop || p.Err != "" {
		t.Fatalf("resync %+v, want it resumed from %d", p, stop)
	}
	c.Close()
	if bad := rrMismatches(t, c, img); len(bad) != 0 {
		t.Fatalf("inconsistent stripes: %v", bad)
	}
}

// TestResyncNothingLeft: an array assembled dirty with nothing to resync — a resume point at
// the very end, or a bitmap with no bit set — counts as clean at once: no resync runs, and
// Close marks it clean (it used to stay dirty, and unclean, for good).
func TestResyncNothingLeft(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy string
	}{{"resume point at the end", ConsistencyNone}, {"bitmap without bits", ConsistencyBitmap}} {
		t.Run(tc.name, func(t *testing.T) {
			paths := rrFiles(t, 3)
			a, err := Create(paths, CreateOptions{Chunk: rrChunk, MemberSize: DataOffset + rrStripes*rrChunk, Consistency: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Repeat([]byte("resync"), 10000)
			if _, err := a.WriteAt(want, 5000); err != nil {
				t.Fatal(err)
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			if tc.policy == ConsistencyBitmap {
				a.bm.Clean(0)
				if st := a.Status(); st.Bitmap == nil || st.Bitmap.Set != 0 {
					t.Fatalf("bitmap after cleaning: %+v", st.Bitmap)
				}
			}
			img := rrFiles(t, 3)
			rrCopy(t, paths, img)
			a.Close()
			if tc.policy == ConsistencyNone {
				// As Close records a resync stopped after its last batch.
				for _, p := range img {
					m, err := OpenMember(p, false)
					if err != nil {
						t.Fatal(err)
					}
					sb, err := readSuperblock(m)
					if err != nil {
						t.Fatal(err)
					}
					sb.Resync = sb.DataSize
					buf := make([]byte, SuperblockSize)
					sb.encode(buf)
					if _, err := m.WriteAt(buf, SuperblockOffset); err != nil {
						t.Fatal(err)
					}
					m.Close()
				}
			}
			b := rrAssemble(t, img, rrFast)
			if st := b.Status(); st.Unclean || st.Sync != nil || !st.Dirty {
				t.Fatalf("assembled dirty with nothing to resync: unclean %v, sync %+v, dirty %v; want dirty, not unclean, no resync",
					st.Unclean, st.Sync, st.Dirty)
			}
			got := make([]byte, len(want))
			if _, err := b.ReadAt(got, 5000); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, want))
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			for i, sb := range rrSuperblocks(t, img) {
				if sb.Dirty || sb.Resync != 0 {
					t.Fatalf("member %d after Close: dirty %v, resync %d; want clean", i, sb.Dirty, sb.Resync)
				}
			}
			if bad := rrMismatches(t, b, img); len(bad) != 0 {
				t.Fatalf("inconsistent stripes: %v", bad)
			}
		})
	}
}
