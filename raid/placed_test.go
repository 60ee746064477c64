package raid_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// placedArray creates an array of 4 members on tmpfs with mapped writes and an hour's
// write-back delay (partial writes stay dirty in the cache), writes every byte once (so every
// member page is in memory: placement needs it) and returns it with its model.
func placedArray(t *testing.T, opts raid.CreateOptions) (*raid.Array, []string, []byte) {
	t.Helper()
	opts.IOOptions.StablePages = true
	opts.IOOptions.WriteBackDelay = time.Hour
	return mappedArray(t, opts)
}

// mappedArray is placedArray with opts' stable pages and write-back delay.
func mappedArray(t *testing.T, opts raid.CreateOptions) (*raid.Array, []string, []byte) {
	t.Helper()
	const chunk, stripes = 16 << 10, 32
	paths := memberPaths(modeDir(t, ioMode{shm: true}), 4)
	opts.Chunk, opts.MemberSize = chunk, raid.DataOffset+stripes*chunk
	opts.IOOptions.MappedWrites = true
	a, err := raid.Create(paths, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	model := make([]byte, mustSize(a))
	fill(newRand(31), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, paths, model
}

// place writes p at off as a placed write, the first received bytes of it, and returns
// CommitPlaced's error; it fails the test if the array declines.
func place(t *testing.T, a *raid.Array, p []byte, off int64, received int) error {
	t.Helper()
	v, h, ok := a.PlaceWrite(off, len(p), nil)
	if !ok {
		t.Fatalf("PlaceWrite(%d, %d) declined", off, len(p))
	}
	n := 0
	for _, b := range v {
		n += copy(b, p[n:received])
	}
	if n != received {
		t.Fatalf("PlaceWrite's slices hold %d of the %d bytes", n, received)
	}
	return a.CommitPlaced(h, received, true)
}

// TestPlacedWrite: a placed write (the payload stored by the caller straight into the members'
// mappings) reads back byte for byte, supersedes the dirty cache heads of its stripes, leaves
// every stripe's parity right (checked on the member files), and counts; one cut short
// (received < n) leaves the stripes consistent with the part that arrived and keeps the dirty
// data of the cache's heads, which was acknowledged.
func TestPlacedWrite(t *testing.T) {
	a, paths, model := placedArray(t, raid.CreateOptions{})
	ss := a.Layout().StripeSize()
	rng := newRand(32)

	// Dirty heads in stripes 3 and 4 (an hour's delay: still in the cache), then a placed write
	// of stripes 2-5 over them: it wins.
	for _, off := range []int64{3*ss + 100, 4*ss + 20000} {
		p := make([]byte, 5000)
		fill(rng, p)
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	p := make([]byte, 4*ss)
	fill(rng, p)
	if err := place(t, a, p, 2*ss, len(p)); err != nil {
		t.Fatal(err)
	}
	copy(model[2*ss:], p)
	compareArray(t, a, model)
	if c := a.Counters(); c.PlacedBytes != uint64(len(p)) {
		t.Fatalf("PlacedBytes = %d, want %d", c.PlacedBytes, len(p))
	}

	// Not aligned to stripes (a 1 MiB write of 48 KiB stripes is not): the whole stripes in
	// the middle are placed, the ends written as ordinary writes, into stripes with dirty heads.
	q := make([]byte, 3*ss+5000)
	fill(rng, q)
	qoff := 20*ss + 9000
	for _, off := range []int64{20*ss + 100, 23*ss + 30000} {
		p := make([]byte, 3000)
		fill(rng, p)
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	if err := place(t, a, q, qoff, len(q)); err != nil {
		t.Fatal(err)
	}
	copy(model[qoff:], q)
	compareArray(t, a, model)
	if c := a.Counters(); c.PlacedBytes != uint64(len(p)+2*int(ss)) { // stripes 21 and 22
		t.Fatalf("PlacedBytes = %d, want %d", c.PlacedBytes, len(p)+2*int(ss))
	}

	// A dirty head in stripe 10's last chunk, then a placed write of stripes 10-11 cut short
	// after stripe 10's first chunk: that chunk holds the new bytes, the dirty head's bytes
	// survive (written out by the Flush), the rest keeps the old bytes.
	C := a.Layout().ChunkSize()
	dirty := make([]byte, 4096)
	fill(rng, dirty)
	if _, err := a.WriteAt(dirty, 10*ss+2*C); err != nil {
		t.Fatal(err)
	}
	copy(model[10*ss+2*C:], dirty)
	fill(rng, p[:2*ss])
	if err := place(t, a, p[:2*ss], 10*ss, int(C)); err != nil {
		t.Fatal(err)
	}
	copy(model[10*ss:], p[:C])
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	compareArray(t, a, model)
	if c := a.Counters(); c.PlacedBytes != uint64(6*ss) {
		t.Fatalf("PlacedBytes = %d after a write cut short, want %d (only complete ones count)", c.PlacedBytes, 6*ss)
	}
	l := a.Layout()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, paths, l, model, -1)
}

// TestPlaceWriteDeclines: the array places writes only into a healthy, unjournaled array with
// mapped writes whose member pages are all in memory, and a write with no whole stripe only
// if the cache holds no newer data of its stripes; anything else is declined with nothing
// done, and the ordinary write that follows works.
func TestPlaceWriteDeclines(t *testing.T) {
	a, paths, model := placedArray(t, raid.CreateOptions{})
	ss := a.Layout().StripeSize()
	decline := func(what string, off int64, n int) {
		t.Helper()
		if v, _, ok := a.PlaceWrite(off, n, nil); ok || len(v) != 0 {
			t.Fatalf("%s: PlaceWrite(%d, %d) placed", what, off, n)
		}
	}
	// Dirty units in stripe 1 (an hour's write-back delay): newer than its members.
	d := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := a.WriteAt(d, ss+8192); err != nil {
		t.Fatal(err)
	}
	copy(model[ss+8192:], d)
	decline("part of a stripe with dirty units", ss, int(ss-4096))
	decline("no whole stripe, one part's stripe with dirty units", ss+512, int(ss))
	decline("past the end", int64(len(model))-ss, int(2*ss))
	decline("empty", 0, 0)
	// The declines took no lock: an ordinary write of the same stripes goes through.
	p := bytes.Repeat([]byte{0xa5}, int(2*ss))
	if _, err := a.WriteAt(p, ss); err != nil {
		t.Fatal(err)
	}
	copy(model[ss:], p)
	if err := a.Fail(paths[2]); err != nil {
		t.Fatal(err)
	}
	decline("degraded", 0, int(ss))
	compareArray(t, a, model)

	// Pages not in memory: a fresh array's members are holes.
	fresh := memberPaths(modeDir(t, ioMode{shm: true}), 4)
	b, err := raid.Create(fresh, raid.CreateOptions{Chunk: 16 << 10, MemberSize: raid.DataOffset + 32*(16<<10),
		IOOptions: raid.IOOptions{MappedWrites: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, _, ok := b.PlaceWrite(0, int(ss), nil); ok {
		t.Fatal("PlaceWrite placed into holes (pages not in memory)")
	}

	// Journaled: the journal must log the data before the members see it.
	dir := modeDir(t, ioMode{shm: true})
	j, _, _ := placedArray(t, raid.CreateOptions{Consistency: raid.ConsistencyJournal,
		JournalPath: filepath.Join(dir, "journal"), JournalSize: 2 << 20})
	if _, _, ok := j.PlaceWrite(0, int(ss), nil); ok {
		t.Fatal("PlaceWrite placed on a journaled array")
	}
}

// placeSteps is place with the payload arriving in steps: after each byte count in steps
// (ascending, below received) it calls PlacedReceived, as the NBD server does after each readv.
func placeSteps(t testing.TB, a *raid.Array, p []byte, off int64, received int, steps []int) error {
	t.Helper()
	v, h, ok := a.PlaceWrite(off, len(p), nil)
	if !ok {
		t.Fatalf("PlaceWrite(%d, %d) declined", off, len(p))
	}
	i, o, n := 0, 0, 0 // the next byte goes to v[i][o]
	for _, end := range append(steps, received) {
		for n < end {
			k := copy(v[i][o:], p[n:end])
			n, o = n+k, o+k
			if o == len(v[i]) {
				i, o = i+1, 0
			}
		}
		if end < received {
			a.PlacedReceived(h, n)
		}
	}
	return a.CommitPlaced(h, received, true)
}

// TestPlacedProgress: a placed write whose parity is computed stripe by stripe as its bytes
// arrive (PlacedReceived, at points inside the head, at stripe boundaries and inside stripes)
// leaves every stripe's parity right, whole or cut short (checked on the member files).
func TestPlacedProgress(t *testing.T) {
	a, paths, model := placedArray(t, raid.CreateOptions{})
	ss := int(a.Layout().StripeSize())
	rng := newRand(33)
	// A head of 9000 bytes, 5 whole stripes, a tail of 7000.
	p := make([]byte, 9000+5*ss+7000)
	fill(rng, p)
	off := int64(4*ss - 9000)
	steps := []int{100, 9000, 9000 + ss/2, 9000 + 2*ss, 9000 + 2*ss + 1, 9000 + 4*ss + 5000}
	if err := placeSteps(t, a, p, off, len(p), steps); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p)
	compareArray(t, a, model)

	// Cut short inside the third whole stripe, after progress up to the second's end.
	q := make([]byte, 4*ss)
	fill(rng, q)
	qoff := int64(12 * ss)
	got := 2*ss + 5000
	if err := placeSteps(t, a, q, qoff, got, []int{ss / 3, 2 * ss}); err != nil {
		t.Fatal(err)
	}
	copy(model[qoff:], q[:got])
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	compareArray(t, a, model)
	l := a.Layout()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, paths, l, model, -1)
}

// BenchmarkPlacedWrite: 1 MiB placed writes (21 stripes of 48 KiB) copied in as a socket read
// would bring them, in one go or in steps of 4 stripes with PlacedReceived after each (the
// NBD server's placedStep): the second computes each stripe's parity while its data is still
// in the CPU's cache.
func BenchmarkPlacedWrite(b *testing.B) {
	for _, step := range []int{0, 4} {
		b.Run(fmt.Sprintf("steps=%d", step), func(b *testing.B) {
			const chunk, stripes = 16 << 10, 256
			paths := memberPaths(modeDir(b, ioMode{shm: true}), 4)
			opts := raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + stripes*chunk}
			opts.IOOptions.MappedWrites = true
			a, err := raid.Create(paths, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			ss := int(a.Layout().StripeSize())
			if _, err := a.WriteAt(make([]byte, stripes*ss), 0); err != nil {
				b.Fatal(err)
			}
			p := make([]byte, 21*ss)
			fill(newRand(34), p)
			var steps []int
			for n := step * ss; step > 0 && n < len(p); n += step * ss {
				steps = append(steps, n)
			}
			b.SetBytes(int64(len(p)))
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				off := int64(i%10) * int64(len(p)) // 10 writes over 10 MiB: not all in the cache
				if err := placeSteps(b, a, p, off, len(p), steps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
