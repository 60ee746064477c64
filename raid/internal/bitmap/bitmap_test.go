package bitmap

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeMembers is an in-memory Members: copies of the bitmap, one per member, and counters.
type fakeMembers struct {
	mu      sync.Mutex
	copies  [][]byte
	flushes int   // WritePages calls
	pages   int   // pages written, per member
	syncs   int   // Sync calls
	err     error // returned by WritePages (nothing written) while set
	// degraded makes Whole answer false; onWhole, if set, runs at the start of Whole.
	degraded atomic.Bool
	onWhole  func()
	// onWrite and onSync, if set, run at the start of WritePages and Sync, without mu.
	onWrite, onSync func()
}

func newFake(members int, size int64) *fakeMembers {
	f := &fakeMembers{}
	for range members {
		f.copies = append(f.copies, make([]byte, size))
	}
	return f
}

func (f *fakeMembers) WritePages(pages []Page) error {
	if f.onWrite != nil {
		f.onWrite()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.flushes++
	for _, p := range pages {
		if len(p.Data) != PageSize || p.Off%PageSize != 0 {
			panic("bad page")
		}
		for _, c := range f.copies {
			copy(c[p.Off:], p.Data)
		}
		f.pages++
	}
	return nil
}

func (f *fakeMembers) Sync() error {
	if f.onSync != nil {
		f.onSync()
	}
	f.mu.Lock()
	f.syncs++
	f.mu.Unlock()
	return nil
}

func (f *fakeMembers) ReadEach(p []byte, each func()) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.copies {
		copy(p, c)
		each()
	}
	return nil
}

func (f *fakeMembers) Whole() bool {
	if f.onWhole != nil {
		f.onWhole()
	}
	return !f.degraded.Load()
}

func (f *fakeMembers) counts() (flushes, pages, syncs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.flushes, f.pages, f.syncs
}

// onDisk reports whether region r's bit is set on member i.
func (f *fakeMembers) onDisk(i int, r int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Bits(f.copies[i]).Has(r)
}

func TestCodec(t *testing.T) {
	for _, tt := range []struct{ bits, bytes int64 }{{1, 4096}, {4096, 4096}, {32768, 4096}, {32769, 8192}} {
		if got := Bytes(tt.bits); got != tt.bytes {
			t.Errorf("Bytes(%d) = %d, want %d", tt.bits, got, tt.bytes)
		}
	}
	for _, tt := range []struct{ stripes, size, region, want int64 }{
		// the default: at most DefaultBits bits, at least DefaultMinRegion (4 MiB) each
		{1000, 3 << 16, 0, 32}, {21845, 48 << 10, 0, 128}, // 4 MiB: 21.3 and 85.3 stripes
		{4 * 4096, 1 << 20, 0, 4}, {4*4096 + 1, 1 << 20, 0, 8}, {1 << 20, 1 << 20, 0, 256},
		{1000, 3 << 16, 5 * 3 << 16, 8}, {1000, 100, 1, 1}, {1000, 100, 101, 2},
	} {
		if got := RegionStripes(tt.stripes, tt.size, tt.region); got != tt.want {
			t.Errorf("RegionStripes(%d, %d, %d) = %d, want %d", tt.stripes, tt.size, tt.region, got, tt.want)
		}
	}
	// Bit r is byte r/8, bit r%8: the md-style order the superblock documents.
	f := newFake(1, 4096)
	b := New(f, 100, 1, nil)
	for _, r := range []int64{0, 9, 99} {
		if err := b.Begin(r, 1); err != nil {
			t.Fatal(err)
		}
		b.End(r, 1)
	}
	want := make([]byte, 4096)
	want[0], want[1], want[12] = 1, 2, 8
	if !bytes.Equal(f.copies[0], want) {
		t.Fatalf("on disk % x, want % x", f.copies[0][:16], want[:16])
	}
}

// TestBeginDurable: Begin returns only once the regions' bits are on every member, and a
// region whose bit is already durable costs no write at all.
func TestBeginDurable(t *testing.T) {
	f := newFake(3, 4096)
	b := New(f, 64, 4, nil)               // 16 regions of 4 stripes
	if err := b.Begin(5, 6); err != nil { // stripes 5..10: regions 1 and 2
		t.Fatal(err)
	}
	for i := range 3 {
		for r := range int64(16) {
			if got, want := f.onDisk(i, r), r == 1 || r == 2; got != want {
				t.Errorf("member %d region %d: bit %v, want %v", i, r, got, want)
			}
		}
	}
	b.End(5, 6)
	for range 100 {
		if err := b.Begin(4, 8); err != nil {
			t.Fatal(err)
		}
		b.End(4, 8)
	}
	if fl, pg, sy := f.counts(); fl != 1 || pg != 1 || sy != 0 {
		t.Fatalf("%d flushes, %d pages, %d syncs; want 1, 1, 0", fl, pg, sy)
	}
	if st := b.Status(); st.Set != 2 || st.Regions != 16 || st.RegionStripes != 4 || st.Flushes != 1 || st.Waits != 1 {
		t.Fatalf("status %+v", st)
	}
}

// TestTryBegin: TryBegin admits a write only to regions whose bits are durable already, writing
// nothing itself; a refused one leaves its bit set in memory (and nothing in flight), and the
// next Begin's flush writes it.
func TestTryBegin(t *testing.T) {
	f := newFake(3, 4096)
	b := New(f, 64, 4, nil) // 16 regions of 4 stripes
	if b.TryBegin(5, 1) {
		t.Fatal("TryBegin admitted a write to a region whose bit is not on disk")
	}
	if fl, _, _ := f.counts(); fl != 0 || f.onDisk(0, 1) {
		t.Fatalf("TryBegin wrote the bitmap (%d flushes)", fl)
	}
	if st := b.Status(); st.Set != 1 {
		t.Fatalf("status %+v after a refused TryBegin: want region 1 set", st)
	}
	if err := b.Begin(9, 1); err != nil { // region 2; the flush takes region 1 along
		t.Fatal(err)
	}
	b.End(9, 1)
	for _, s := range []int64{5, 9} {
		if !b.TryBegin(s, 1) {
			t.Fatalf("TryBegin(%d) refused with its region's bit durable", s)
		}
		b.End(s, 1)
	}
	if !f.onDisk(0, 1) || !f.onDisk(2, 2) {
		t.Fatal("the regions' bits are not on disk")
	}
	if fl, _, _ := f.counts(); fl != 1 {
		t.Fatalf("%d flushes, want 1", fl)
	}
}

// TestGroupCommit: writers that set bits while a flush is under way share the next one.
func TestGroupCommit(t *testing.T) {
	f := newFake(2, 4096)
	b := New(f, 100, 1, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.onWrite = func() { once.Do(func() { close(entered); <-release }) }
	errs := make(chan error, 11)
	go func() { errs <- b.Begin(0, 1) }()
	<-entered
	for r := range int64(10) {
		go func() { errs <- b.Begin(10+r, 1) }()
	}
	for deadline := time.Now().Add(10 * time.Second); b.Status().Set < 11; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("writers never set their bits")
		}
	}
	close(release)
	for range 11 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if fl, _, _ := f.counts(); fl != 2 {
		t.Fatalf("%d flushes for one writer and ten that waited together, want 2", fl)
	}
	for r := range int64(10) {
		if !f.onDisk(1, 10+r) {
			t.Errorf("region %d not durable", 10+r)
		}
	}
}

// TestDirtyPagesOnly: a flush writes only the pages that changed.
func TestDirtyPagesOnly(t *testing.T) {
	f := newFake(1, 3*PageSize)
	rec := &recorder{Members: f}
	b := New(rec, 3*PageSize*8, 1, nil)
	if err := b.Begin(PageSize*8+5, 1); err != nil { // page 1
		t.Fatal(err)
	}
	b.End(PageSize*8+5, 1)
	if len(rec.offs) != 1 || rec.offs[0] != PageSize {
		t.Fatalf("pages written at %v, want [4096]", rec.offs)
	}
}

type recorder struct {
	Members
	offs []int64
}

func (r *recorder) WritePages(pages []Page) error {
	for _, p := range pages {
		r.offs = append(r.offs, p.Off)
	}
	return r.Members.WritePages(pages)
}

// TestClean: the cleaner clears only idle regions with no write in flight, none begun while
// it synced, and none held for the resync; it syncs before it clears.
func TestClean(t *testing.T) {
	f := newFake(2, 4096)
	b := New(f, 10, 1, nil)
	for r := range int64(4) {
		if err := b.Begin(r, 1); err != nil {
			t.Fatal(err)
		}
		if r != 1 {
			b.End(r, 1) // region 1 stays in flight
		}
	}
	b.Hold(func(s int64) bool { return s == 2 }) // region 2 waits for the resync
	// Region 3 is written while the members are synced.
	f.onSync = func() {
		f.onSync = nil
		if err := b.Begin(3, 1); err != nil {
			t.Error(err)
		}
		b.End(3, 1)
	}
	b.Clean(0)
	_, _, syncs := f.counts()
	if syncs != 1 {
		t.Fatalf("%d syncs, want 1", syncs)
	}
	for r, want := range []bool{false, true, true, true} {
		if got := f.onDisk(0, int64(r)); got != want {
			t.Errorf("after clean: region %d bit %v, want %v", r, got, want)
		}
	}
	// An idle spell that is not long enough clears nothing and syncs nothing.
	b.Clean(time.Hour)
	if _, _, s := f.counts(); s != 1 {
		t.Fatalf("a clean with nothing to clear synced the members")
	}
	b.End(1, 1)
	b.Release(2)
	b.Clean(0)
	for r := range int64(4) {
		if f.onDisk(1, r) {
			t.Errorf("region %d still set", r)
		}
	}
	if st := b.Status(); st.Set != 0 {
		t.Fatalf("status %+v", st)
	}
}

// TestKeptWhileDegraded: while the array is not whole no bit is cleared, by the cleaner or
// by ClearAll — not even one whose write ended long ago — nor by a clean whose members
// stopped being whole during its sync; Keep sets the bits an assembly read back; once whole
// again they are all cleared as usual.
func TestKeptWhileDegraded(t *testing.T) {
	f := newFake(2, PageSize)
	b := New(f, 10, 1, nil)
	write := func(r int64) {
		t.Helper()
		if err := b.Begin(r, 1); err != nil {
			t.Fatal(err)
		}
		b.End(r, 1)
	}
	write(0)
	f.degraded.Store(true)
	write(1)
	b.Clean(0)
	if err := b.ClearAll(); err != nil {
		t.Fatal(err)
	}
	for r, want := range []bool{true, true, false} {
		if got := f.onDisk(0, int64(r)); got != want {
			t.Errorf("degraded: region %d bit %v, want %v", r, got, want)
		}
	}
	// A member fails while the cleaner syncs: what was written may be lost on it.
	f.degraded.Store(false)
	f.onSync = func() { f.degraded.Store(true) }
	b.Clean(0)
	f.onSync = nil
	if !f.onDisk(0, 0) || !f.onDisk(0, 1) {
		t.Errorf("a clean that saw the array degrade during its sync cleared bits")
	}
	// Assembled degraded: the bits read back are kept (a fresh bitmap over the same disks).
	b2 := New(f, 10, 1, nil)
	bits, err := b2.Load()
	if err != nil {
		t.Fatal(err)
	}
	b2.Keep(bits)
	b2.Hold(nil)
	b2.Clean(0)
	if err := b2.ClearAll(); err != nil {
		t.Fatal(err)
	}
	if !b2.IsSet(0) || !b2.IsSet(1) || b2.IsSet(2) || !f.onDisk(1, 0) || !f.onDisk(1, 1) {
		t.Errorf("kept bits lost after assembly: %v %v %v", b2.IsSet(0), b2.IsSet(1), b2.IsSet(2))
	}
	f.degraded.Store(false)
	b2.Clean(0)
	for r := range int64(3) {
		if f.onDisk(0, r) || f.onDisk(1, r) {
			t.Errorf("whole again: region %d still set", r)
		}
	}
}

// TestHoldAndClearAll: Hold marks every page changed (the first flush rewrites the bitmap
// whole); ClearAll clears all but the held and those in flight.
func TestHoldAndClearAll(t *testing.T) {
	f := newFake(1, 2*PageSize)
	for i := range f.copies[0] {
		f.copies[0][i] = 0xff // stale bits of an earlier life
	}
	b := New(f, PageSize*8+8, 1, nil) // 2 pages, the second nearly empty
	b.Hold(func(s int64) bool { return s == 7 })
	if err := b.Begin(3, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.ClearAll(); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 2*PageSize)
	want[0] = 1<<3 | 1<<7
	if !bytes.Equal(f.copies[0], want) {
		t.Fatalf("bitmap after ClearAll starts % x, want % x", f.copies[0][:4], want[:4])
	}
	if _, pg, _ := f.counts(); pg != 2 {
		t.Fatalf("%d pages written, want 2 (the whole bitmap)", pg)
	}
}

// TestLoad: the union of the members' copies; a bit past the last region is ErrCorrupt.
func TestLoad(t *testing.T) {
	f := newFake(3, PageSize)
	b := New(f, 20, 1, nil)
	f.copies[0][0], f.copies[2][2] = 1, 8
	bits, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	for r := range int64(20) {
		if got, want := bits.Has(r), r == 0 || r == 19; got != want {
			t.Errorf("region %d: %v, want %v", r, got, want)
		}
	}
	f.copies[1][2] = 0x10 // bit 20: past the last region
	if _, err := b.Load(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Load with bit 20 of 20 set: %v, want ErrCorrupt", err)
	}
}

// TestUnion: bit r of the union is set if any bitmap has it (nil ones skipped, shorter ones
// as if zero-padded); none given is nil; a bit past the last region, in any of them, is
// ErrCorrupt however the others look.
func TestUnion(t *testing.T) {
	if u, err := Union(20); u != nil || err != nil {
		t.Fatalf("Union of none: %v, %v; want nil, nil", u, err)
	}
	if u, err := Union(20, nil, nil); u != nil || err != nil {
		t.Fatalf("Union of nil bitmaps: %v, %v; want nil, nil", u, err)
	}
	a, b, c := make([]byte, 8), make([]byte, 3), []byte{0x80}
	a[0], b[1], b[2] = 1<<2, 1<<1, 1<<3 // regions 2, 9, 19
	u, err := Union(20, nil, a, b, c)   // c: region 7, and shorter than the rest
	if err != nil {
		t.Fatal(err)
	}
	if len(u) != 8 {
		t.Errorf("union of %d bytes, want 8 (the longest)", len(u))
	}
	for r := range int64(64) {
		if got, want := u.Has(r), r == 2 || r == 7 || r == 9 || r == 19; got != want {
			t.Errorf("region %d: %v, want %v", r, got, want)
		}
	}
	if u, err := Union(20, c); err != nil || len(u) != 3 || !u.Has(7) || u.Has(19) {
		t.Fatalf("Union(20, one byte): % x, %v; want 3 bytes (20 bits), region 7 alone", u, err)
	}
	for _, bad := range []int64{20, 23, 24, 63} { // past the last region: in the last byte or after
		d := make([]byte, 8)
		d[bad/8] = 1 << (bad % 8)
		if u, err := Union(20, a, d, b); !errors.Is(err, ErrCorrupt) || u != nil {
			t.Errorf("Union with bit %d of 20 set: % x, %v; want nil, ErrCorrupt", bad, u, err)
		}
	}
}

// TestWriteFailure: Begin returns what WritePages returns.
func TestWriteFailure(t *testing.T) {
	f := newFake(1, PageSize)
	b := New(f, 10, 1, nil)
	errFailed := errors.New("array failed")
	f.err = errFailed
	if err := b.Begin(0, 1); !errors.Is(err, errFailed) {
		t.Fatalf("Begin: %v, want the members' error", err)
	}
	b.End(0, 1)
}

// TestCost counts what the bitmap costs the members for random writes: one flush of one
// page per region the first time it is written, nothing after, and no sync (only the cleaner
// syncs). It fails if Begin writes the bitmap when the bit is already durable, or writes
// pages that did not change.
func TestCost(t *testing.T) {
	const stripes, regions, writes = 4096, 64, 10000
	f := newFake(4, PageSize)
	b := New(f, stripes, stripes/regions, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[int64]bool{}
	for range writes {
		s := rng.Int64N(stripes)
		seen[s/(stripes/regions)] = true
		if err := b.Begin(s, 1); err != nil {
			t.Fatal(err)
		}
		b.End(s, 1)
	}
	fl, pg, sy := f.counts()
	if fl != len(seen) || pg != len(seen) || sy != 0 {
		t.Fatalf("%d writes over %d regions: %d bitmap flushes, %d pages, %d syncs; want %d, %d, 0",
			writes, len(seen), fl, pg, sy, len(seen), len(seen))
	}
	if st := b.Status(); st.Waits != uint64(len(seen)) {
		t.Fatalf("%d writes waited for the bitmap, want %d", st.Waits, len(seen))
	}
}
