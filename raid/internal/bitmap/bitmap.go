package bitmap

import (
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
)

const (
	// DefaultBits is the most bits the default region size gives: the region is the smallest
	// power-of-two number of stripes for which the array needs at most this many, and that
	// covers at least DefaultMinRegion.
	DefaultBits = 4096
	// DefaultMinRegion is the fewest array bytes a default region covers. A write into a
	// region whose bit is clear waits for a bitmap write, and the cleaner writes the bitmap
	// again once the region is idle: with regions of a few stripes (an array of a few GiB
	// split into 4096) a sequential writer waited for a bitmap write every few stripes, and
	// random writes across a few hundred MiB kept setting and clearing bits. md's default
	// bitmap chunk is 64 MiB; 4 MiB keeps a resync after a crash, or a re-add, to the
	// regions written on arrays of a few hundred MiB too.
	DefaultMinRegion = 4 << 20
	// ClearDelay is how long a region must have seen no write before its bit is cleared
	// (after the members are synced): a region written again soon after would need its bit
	// set, and synced, again.
	ClearDelay = 3 * time.Second
	// PageSize is the unit the bitmap is written in.
	PageSize = 4096
)

// ErrCorrupt is returned by Load when the members' bitmaps have a bit set past the last
// region: raid5d never sets one, so the rest cannot be trusted either.
var ErrCorrupt = errors.New("raid: write-intent bitmap corrupt")

// RegionStripes returns the stripes per region for an array of stripes stripes of
// stripeSize bytes: regionBytes rounded up to a power-of-two number of stripes, or for 0 the
// default (at most DefaultBits bits, at least DefaultMinRegion bytes).
func RegionStripes(stripes, stripeSize, regionBytes int64) int64 {
	want := int64(1)
	if regionBytes > 0 {
		want = (regionBytes + stripeSize - 1) / stripeSize
	} else {
		want = max((stripes+DefaultBits-1)/DefaultBits, (DefaultMinRegion+stripeSize-1)/stripeSize)
	}
	if want <= 1 {
		return 1
	}
	return 1 << (64 - bits.LeadingZeros64(uint64(want-1)))
}

// Bytes is the on-disk size of a bitmap of n bits: whole pages.
func Bytes(n int64) int64 { return ((n+7)/8 + PageSize - 1) / PageSize * PageSize }

// Members is what the bitmap needs of the array: the same bitmap on every working member of
// a role, at offsets relative to the bitmap's start. WritePages calls never overlap (the
// bitmap serialises its flushes); Sync and ReadEach may run alongside one.
type Members interface {
	// WritePages writes every page to every working member, durably on return, and fails
	// (marks faulty) each member whose write fails; it returns an error only if that leaves
	// the array failed (then wrapping the array's failure sentinel). Data is only read, and
	// not kept past the return unless a hung member's write outlives it: the caller never
	// reuses it.
	WritePages(pages []Page) error
	// Sync makes every completed member write durable on every working member (the
	// cleaner's condition for clearing a bit).
	Sync() error
	// ReadEach reads len(p) bytes at offset 0 of the bitmap of each working member into p
	// and calls each after every read; it returns the first read error.
	ReadEach(p []byte, each func()) error
	// Whole reports whether every role has an active member and the superblocks say so
	// (their cleared mark is current). Only then may a bit be cleared: while a role is
	// missing or being rebuilt the set bits are what a member that comes back missed
	// (md's --re-add), and they stay set.
	Whole() bool
}

// Page is one page of a bitmap write: Data (PageSize bytes) at bitmap offset Off.
type Page struct {
	Off  int64
	Data []byte
}

// Bitmap is the array's write-intent bitmap: bit r set on disk means region r (regionStripes
// stripes) may have been written since its parity was last known consistent. A stripe write
// calls Begin before its first member write — which returns once the region's bit is durable
// on every member — and End after its last; the cleaner (Run) clears bits of regions idle
// for ClearDelay, after syncing the members.
//
// Bit updates are batched: a writer that needs a bit sets it in memory and waits for a flush
// that started after that; one flush (flushMu) writes every page changed since the last one,
// so concurrent writers to new regions share a flush. All methods may be called concurrently.
type Bitmap struct {
	m             Members
	log           *slog.Logger
	regionStripes int64
	nbits         int64

	// mu guards bits, setSeq, inflight, writes, last, held, dirtyPg, seq.
	mu       sync.Mutex
	bits     []byte   // the bitmap as it should be on disk
	setSeq   []uint64 // per region: seq of the change that set its bit
	inflight []int32  // per region: stripe writes between begin and end
	writes   []uint64 // per region: stripe writes begun (the cleaner's "written since?" check)
	last     []int64  // per region: Unix nanoseconds of the last begin
	held     []bool   // per region: waiting for the resync; never cleared by the cleaner
	dirtyPg  []bool   // per page: changed since the last flush
	seq      uint64   // bumped by every change of bits

	// flushMu serialises flushes. durable is the seq of the last change known durable on
	// the members; it is stored under flushMu and read without it.
	flushMu sync.Mutex
	durable atomic.Uint64

	flushes, waits atomic.Uint64
	stop           chan struct{} // closed by Stop: Run returns
	stopOnce       sync.Once
}

// New returns the bitmap of an array of stripes stripes, regionStripes per bit, written to m;
// every bit clear in memory. log (nil: slog.Default) gets the cleaner's errors.
func New(m Members, stripes, regionStripes int64, log *slog.Logger) *Bitmap {
	if log == nil {
		log = slog.Default()
	}
	n := (stripes + regionStripes - 1) / regionStripes
	size := Bytes(n)
	return &Bitmap{
		m: m, log: log, regionStripes: regionStripes, nbits: n,
		bits: make([]byte, size), setSeq: make([]uint64, n), inflight: make([]int32, n),
		writes: make([]uint64, n), last: make([]int64, n), held: make([]bool, n),
		dirtyPg: make([]bool, size/PageSize),
		stop:    make(chan struct{}),
	}
}

// RegionStripes returns the stripes each bit covers.
func (b *Bitmap) RegionStripes() int64 { return b.regionStripes }

func (b *Bitmap) isSet(r int64) bool { return b.bits[r/8]&(1<<(r%8)) != 0 }

// setLocked sets or clears bit r; b.mu is held.
func (b *Bitmap) setLocked(r int64, on bool) {
	if on {
		b.bits[r/8] |= 1 << (r % 8)
	} else {
		b.bits[r/8] &^= 1 << (r % 8)
	}
	b.dirtyPg[r/8/PageSize] = true
	b.seq++
}

// Begin declares a write to stripes [s0, s0+n) about to be issued and returns once their
// regions' bits are durable on the members (or the bitmap could not be written to enough of
// them: then WritePages's error). Every Begin is paired with an End, error or not.
func (b *Bitmap) Begin(s0, n int64) error {
	need := b.mark(s0, n)
	if b.durable.Load() >= need { // the common case: the bit has long been on disk
		return nil
	}
	b.waits.Add(1)
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	if b.durable.Load() >= need { // a flush that started after ours was set covered it
		return nil
	}
	return b.flushLocked()
}

// TryBegin is Begin for a caller that must not wait: it reports true, and the caller must call
// End, when the regions' bits are durable already; else it reports false, having ended the
// declaration itself (the bits stay set, to be written by the next flush).
func (b *Bitmap) TryBegin(s0, n int64) bool {
	if b.durable.Load() >= b.mark(s0, n) {
		return true
	}
	b.End(s0, n)
	return false
}

// mark declares a write to stripes [s0, s0+n) in memory, setting their regions' bits, and
// returns the flush sequence number that makes them durable.
func (b *Bitmap) mark(s0, n int64) (need uint64) {
	r0, r1 := s0/b.regionStripes, (s0+n-1)/b.regionStripes
	now := time.Now().UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := r0; r <= r1; r++ {
		b.inflight[r]++
		b.writes[r]++
		b.last[r] = now
		if !b.isSet(r) {
			b.setLocked(r, true)
			b.setSeq[r] = b.seq
		}
		need = max(need, b.setSeq[r])
	}
	return need
}

// End declares the writes of the matching Begin completed.
func (b *Bitmap) End(s0, n int64) {
	r0, r1 := s0/b.regionStripes, (s0+n-1)/b.regionStripes
	b.mu.Lock()
	for r := r0; r <= r1; r++ {
		b.inflight[r]--
	}
	b.mu.Unlock()
}

// flushLocked writes every page changed since the last flush (WritePages). The caller holds
// flushMu.
func (b *Bitmap) flushLocked() error {
	b.mu.Lock()
	seq := b.seq
	var pages []Page
	for p, d := range b.dirtyPg {
		if d {
			pages = append(pages, Page{Off: int64(p) * PageSize})
			b.dirtyPg[p] = false
		}
	}
	// Copy the pages while holding mu: writers may change bits meanwhile. The copy is this
	// flush's own, so a member write that outlives WritePages reads nothing reused.
	img := aligned.Make(len(pages) * PageSize) // aligned for direct I/O
	for i := range pages {
		off := pages[i].Off
		pages[i].Data = img[i*PageSize : (i+1)*PageSize]
		copy(pages[i].Data, b.bits[off:off+PageSize])
	}
	b.mu.Unlock()
	if len(pages) == 0 {
		b.durable.Store(seq)
		return nil
	}
	if err := b.m.WritePages(pages); err != nil {
		return err
	}
	b.durable.Store(seq)
	b.flushes.Add(1)
	return nil
}

// Release lets the cleaner clear the bit of region r: the resync has made it consistent.
func (b *Bitmap) Release(r int64) {
	b.mu.Lock()
	b.held[r] = false
	b.mu.Unlock()
}

// Run is the cleaner: every second it clears the bits of regions idle for ClearDelay, until
// Stop.
func (b *Bitmap) Run() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.Clean(ClearDelay)
		}
	}
}

// Stop makes Run return; it may be called more than once.
func (b *Bitmap) Stop() { b.stopOnce.Do(func() { close(b.stop) }) }

// Clean clears the bits of regions with no write in flight, none begun for idle, and none
// begun while the members were being synced: their writes are durable, so their stripes are
// consistent on disk. Regions waiting for the resync keep their bits, and while the array is
// not whole (Members.Whole, asked before and after the sync: a member that fails meanwhile
// may have lost the writes) every bit stays set.
func (b *Bitmap) Clean(idle time.Duration) {
	if !b.m.Whole() {
		return
	}
	cutoff := time.Now().Add(-idle).UnixNano()
	type cand struct {
		r      int64
		writes uint64
	}
	var cands []cand
	b.mu.Lock()
	for r := range b.nbits {
		if b.isSet(r) && !b.held[r] && b.inflight[r] == 0 && b.last[r] <= cutoff {
			cands = append(cands, cand{r, b.writes[r]})
		}
	}
	b.mu.Unlock()
	if len(cands) == 0 {
		return
	}
	if err := b.m.Sync(); err != nil || !b.m.Whole() {
		return
	}
	b.mu.Lock()
	for _, c := range cands {
		if b.inflight[c.r] == 0 && b.writes[c.r] == c.writes && !b.held[c.r] {
			b.setLocked(c.r, false)
		}
	}
	b.mu.Unlock()
	b.flushMu.Lock()
	if err := b.flushLocked(); err != nil {
		b.log.Error("raid: clearing write-intent bits failed", "err", err)
	}
	b.flushMu.Unlock()
}

// Status is what the bitmap reports of itself.
type Status struct {
	RegionStripes int64  // stripes per bit
	Regions       int    // bits
	Set           int    // bits set in memory now (regions being written, or recently, or waiting for the resync)
	Flushes       uint64 // bitmap writes (each: the changed pages to every member, made durable)
	Waits         uint64 // Begins that waited for a bitmap write
}

// Status returns the bitmap's size, the bits set now and its counters.
func (b *Bitmap) Status() Status {
	b.mu.Lock()
	set := 0
	for r := range b.nbits {
		if b.isSet(r) {
			set++
		}
	}
	b.mu.Unlock()
	return Status{RegionStripes: b.regionStripes, Regions: int(b.nbits), Set: set,
		Flushes: b.flushes.Load(), Waits: b.waits.Load()}
}

// Bits is a bitmap as read from the members: bit r (byte r/8, bit r%8) for region r.
type Bits []byte

// Has reports whether region r's bit is set.
func (bs Bits) Has(r int64) bool { return bs[r/8]&(1<<(r%8)) != 0 }

// Load reads the bitmap of every working member (ReadEach) and returns their Union: the
// regions an unclean shutdown may have left inconsistent. It returns the read error, or
// ErrCorrupt.
func (b *Bitmap) Load() (Bits, error) {
	var read [][]byte
	buf := aligned.Make(len(b.bits)) // aligned for direct I/O
	err := b.m.ReadEach(buf, func() { read = append(read, append([]byte(nil), buf...)) })
	if err != nil {
		return nil, err
	}
	union, err := Union(b.nbits, read...)
	if union == nil && err == nil {
		union = make(Bits, len(b.bits)) // no working member read: nothing set
	}
	return union, err
}

// Union returns the union of the bitmaps bms of an array of nbits regions (bit r set if any
// has it; nil entries skipped; at least one bit per region, as long as the longest entry),
// nil if every entry is nil, or ErrCorrupt if a bit past the last region is set: raid5d
// never sets one, so garbage there means the rest is garbage too.
func Union(nbits int64, bms ...[]byte) (Bits, error) {
	var union Bits
	for _, bm := range bms {
		if bm == nil {
			continue
		}
		if union == nil {
			union = make(Bits, (nbits+7)/8)
		}
		if len(bm) > len(union) {
			union = append(union, make(Bits, len(bm)-len(union))...)
		}
		for i, v := range bm {
			union[i] |= v
		}
	}
	for r := nbits; r < int64(len(union))*8; r++ {
		if union.Has(r) {
			return nil, fmt.Errorf("%w: bit %d set, the array has %d regions", ErrCorrupt, r, nbits)
		}
	}
	return union, nil
}

// Hold sets, in memory, the bits of the regions whose first stripe pending reports (nil:
// none) and marks them held until Release; every page is marked changed so that the first
// flush rewrites the bitmap whole (bits left set by a clean shutdown are cleared with it).
func (b *Bitmap) Hold(pending func(stripe int64) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.nbits {
		if pending != nil && pending(r*b.regionStripes) {
			b.setLocked(r, true)
			b.held[r] = true
		}
	}
	for p := range b.dirtyPg {
		b.dirtyPg[p] = true
	}
	b.seq++
}

// Keep sets, in memory, the bits set in bits (the members' bitmap as Load read it; nil: every
// bit), to be written at the next flush: an array assembled degraded keeps the regions
// written while its missing member was away. Unlike Hold's, the cleaner clears them once the
// array is whole again.
func (b *Bitmap) Keep(bits Bits) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.nbits {
		if (bits == nil || bits.Has(r)) && !b.isSet(r) {
			b.setLocked(r, true)
			b.setSeq[r] = b.seq
		}
	}
}

// IsSet reports whether region r's bit is set in memory now.
func (b *Bitmap) IsSet(r int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isSet(r)
}

// ClearAll clears every bit not held and with no write in flight and writes the bitmap; the
// array calls it at a clean shutdown, after the final sync. While the array is not whole
// (Members.Whole) it clears nothing and only writes what changed.
func (b *Bitmap) ClearAll() error {
	whole := b.m.Whole()
	b.mu.Lock()
	for r := range b.nbits {
		if whole && b.isSet(r) && !b.held[r] && b.inflight[r] == 0 {
			b.setLocked(r, false)
		}
	}
	b.mu.Unlock()
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	return b.flushLocked()
}
