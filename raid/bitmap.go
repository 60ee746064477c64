package raid

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Write-intent bitmap defaults and limits (doc.go # Layout, # Crash consistency).
const (
	// DefaultBitmapBits is the most bits the default region size gives: the region is the
	// smallest power-of-two number of stripes for which the array needs at most this many.
	DefaultBitmapBits = 4096
	// BitmapOffset is the member offset of the bitmap, the start of the reserved area.
	BitmapOffset = ReservedOffset
	// MaxBitmapBytes is the room the reserved area has for it.
	MaxBitmapBytes = DataOffset - ReservedOffset
	// BitmapClearDelay is how long a region must have seen no write before its bit is
	// cleared (after the members are synced): a region written again soon after would need
	// its bit set, and synced, again.
	BitmapClearDelay = 3 * time.Second

	bitmapPage = 4096 // the bitmap is written in pages of this size
)

// ErrBitmapRegion is returned by Create when CreateOptions.BitmapRegion gives a bitmap that
// does not fit in the reserved area.
var ErrBitmapRegion = errors.New("raid: write-intent bitmap region too small: the bitmap does not fit in the reserved area")

// BitmapStatus describes the write-intent bitmap (Status.Bitmap).
type BitmapStatus struct {
	RegionBytes int64  // array bytes per bit (a power-of-two number of stripes)
	Regions     int    // bits
	Set         int    // bits set in memory now (regions being written, or recently, or waiting for the resync)
	Flushes     uint64 // bitmap writes (each: the changed pages to every member, made durable)
	Waits       uint64 // stripe writes that waited for a bitmap write
}

// bitmapRegionStripes returns the stripes per region for an array of stripes stripes of
// stripeSize bytes: regionBytes rounded up to a power-of-two number of stripes, or for 0 the
// default (at most DefaultBitmapBits bits).
func bitmapRegionStripes(stripes, stripeSize, regionBytes int64) int64 {
	want := int64(1)
	if regionBytes > 0 {
		want = (regionBytes + stripeSize - 1) / stripeSize
	} else {
		want = (stripes + DefaultBitmapBits - 1) / DefaultBitmapBits
	}
	if want <= 1 {
		return 1
	}
	return 1 << (64 - bits.LeadingZeros64(uint64(want-1)))
}

// bitmap is the array's write-intent bitmap: bit r set on disk means region r (regionStripes
// stripes) may have been written since its parity was last known consistent. A stripe write
// calls begin before its first member write — which returns once the region's bit is durable
// on every member — and end after its last; the cleaner clears bits of regions idle for
// BitmapClearDelay, after syncing the members.
//
// Bit updates are batched: a writer that needs a bit sets it in memory and waits for a flush
// that started after that; one flush (flushMu) writes every page changed since the last one,
// so concurrent writers to new regions share a flush.
type bitmap struct {
	a             *Array
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
	stop           chan struct{} // closed by Close: the cleaner returns
	stopOnce       sync.Once
}

func newBitmap(a *Array, regionStripes int64) *bitmap {
	stripes := a.memberData / a.layout.ChunkSize()
	n := (stripes + regionStripes - 1) / regionStripes
	size := bitmapBytes(n)
	return &bitmap{
		a: a, regionStripes: regionStripes, nbits: n,
		bits: make([]byte, size), setSeq: make([]uint64, n), inflight: make([]int32, n),
		writes: make([]uint64, n), last: make([]int64, n), held: make([]bool, n),
		dirtyPg: make([]bool, size/bitmapPage),
		stop:    make(chan struct{}),
	}
}

// bitmapBytes is the on-disk size of a bitmap of n bits: whole pages.
func bitmapBytes(n int64) int64 { return ((n+7)/8 + bitmapPage - 1) / bitmapPage * bitmapPage }

func (b *bitmap) isSet(r int64) bool { return b.bits[r/8]&(1<<(r%8)) != 0 }

// setLocked sets or clears bit r; b.mu is held.
func (b *bitmap) setLocked(r int64, on bool) {
	if on {
		b.bits[r/8] |= 1 << (r % 8)
	} else {
		b.bits[r/8] &^= 1 << (r % 8)
	}
	b.dirtyPg[r/8/bitmapPage] = true
	b.seq++
}

// begin declares a write to stripes [s0, s0+n) about to be issued and returns once their
// regions' bits are durable on the members (or the bitmap could not be written to enough of
// them: then an ErrArrayFailed error). Every begin is paired with an end.
func (b *bitmap) begin(s0, n int64) error {
	r0, r1 := s0/b.regionStripes, (s0+n-1)/b.regionStripes
	now := time.Now().UnixNano()
	need := uint64(0)
	b.mu.Lock()
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
	b.mu.Unlock()
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

// end declares the writes of the matching begin completed.
func (b *bitmap) end(s0, n int64) {
	r0, r1 := s0/b.regionStripes, (s0+n-1)/b.regionStripes
	b.mu.Lock()
	for r := r0; r <= r1; r++ {
		b.inflight[r]--
	}
	b.mu.Unlock()
}

// flushLocked writes every page changed since the last flush to every working member of a
// role, durably (RWF_DSYNC where the member supports it, else a write and a Sync). The
// caller holds flushMu. A member that fails is marked faulty; the error is returned only if
// that leaves the array failed.
func (b *bitmap) flushLocked() error {
	a := b.a
	b.mu.Lock()
	seq := b.seq
	var pages []int
	for p, d := range b.dirtyPg {
		if d {
			pages = append(pages, p)
			b.dirtyPg[p] = false
		}
	}
	// Copy the pages while holding mu: writers may change bits meanwhile.
	img := make([]byte, len(pages)*bitmapPage)
	for i, p := range pages {
		copy(img[i*bitmapPage:], b.bits[p*bitmapPage:(p+1)*bitmapPage])
	}
	b.mu.Unlock()
	if len(pages) == 0 {
		b.durable.Store(seq)
		return nil
	}
	var ms []*member
	var roles []int
	for r := range a.roles.n() {
		if m := a.roles.working(r); m != nil {
			ms, roles = append(ms, m), append(roles, r)
		}
	}
	// Concurrently, each bounded by the member timeout (eachMember): begin holds flushMu
	// meanwhile, so one member that hangs must not hold every write's bitmap update with it.
	// img is this flush's own, so a write that outlives the wait reads nothing reused.
	res := a.eachMember(ms, func(i int, m *member) error {
		r := roles[i]
		for k, p := range pages {
			off := BitmapOffset + int64(p)*bitmapPage
			if !a.roles.enter(r) { // the array has failed: its survivors stay as they were
				return errGateShut
			}
			err := writeDurable(m, img[k*bitmapPage:(k+1)*bitmapPage], off, k == len(pages)-1)
			a.roles.leave(r)
			if err != nil {
				return memberErr(m, r, "write bitmap", off, err)
			}
		}
		return nil
	})
	errs := make([]error, len(ms))
	for i, err := range res {
		switch {
		case err == nil:
		case err == errGateShut:
			errs[i] = err
		default:
			if errors.Is(err, ErrMemberHung) {
				err = memberErr(ms[i], roles[i], "write bitmap", BitmapOffset, err)
			}
			ms[i].writeErrs.Add(1)
			a.fail(ms[i], err)
			if a.roles.failed() {
				errs[i] = err
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: writing the write-intent bitmap: %w", ErrArrayFailed, err)
	}
	b.durable.Store(seq)
	b.flushes.Add(1)
	return nil
}

// dsyncWriter is a Member that can write one range durably by itself (member.DSyncWriter:
// pwritev2 RWF_DSYNC), cheaper than a write and an fdatasync of the whole member.
type dsyncWriter interface {
	WriteAtDSync(p []byte, off int64) (int, error)
}

// writeDurable writes p at off of m durably: with RWF_DSYNC if m can, else WriteAt, and Sync
// if last (the caller writes several pages and syncs once).
func writeDurable(m *member, p []byte, off int64, last bool) error {
	if w, ok := m.Member.(dsyncWriter); ok {
		_, err := w.WriteAtDSync(p, off)
		return err
	}
	if _, err := m.WriteAt(p, off); err != nil {
		return err
	}
	if last {
		return m.Sync()
	}
	return nil
}

// release lets the cleaner clear region r's bit: the resync has made it consistent.
func (b *bitmap) release(r int64) {
	b.mu.Lock()
	b.held[r] = false
	b.mu.Unlock()
}

// cleaner clears, every second, the bits of regions idle for BitmapClearDelay, until stop.
func (b *bitmap) cleaner() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.clean(BitmapClearDelay)
		}
	}
}

// clean clears the bits of regions with no write in flight, none begun for idle, and none
// begun while the members were being synced: their writes are durable, so their stripes are
// consistent on disk. Regions waiting for the resync keep their bits.
func (b *bitmap) clean(idle time.Duration) {
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
	if err := b.a.syncMembers(); err != nil {
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
		b.a.log.Error("raid: clearing write-intent bits failed", "err", err)
	}
	b.flushMu.Unlock()
}

func (b *bitmap) status() BitmapStatus {
	b.mu.Lock()
	set := 0
	for r := range b.nbits {
		if b.isSet(r) {
			set++
		}
	}
	b.mu.Unlock()
	return BitmapStatus{
		RegionBytes: b.regionStripes * b.a.layout.StripeSize(), Regions: int(b.nbits), Set: set,
		Flushes: b.flushes.Load(), Waits: b.waits.Load(),
	}
}

// load reads the bitmap of every working member of a role and returns their union (bit r
// set if any member has it), or an error if one could not be read.
func (b *bitmap) load() ([]byte, error) {
	a := b.a
	union := make([]byte, len(b.bits))
	buf := make([]byte, len(b.bits))
	for r := range a.roles.n() {
		m := a.roles.working(r)
		if m == nil {
			continue
		}
		if _, err := m.ReadAt(buf, BitmapOffset); err != nil {
			return nil, memberErr(m, r, "read bitmap", BitmapOffset, err)
		}
		for i := range union {
			union[i] |= buf[i]
		}
	}
	// Bits past the last region are never set by raid5d: garbage there means garbage.
	for r := b.nbits; r < int64(len(union))*8; r++ {
		if union[r/8]&(1<<(r%8)) != 0 {
			return nil, fmt.Errorf("%w: bit %d set, the array has %d regions", ErrBadSuperblock, r, b.nbits)
		}
	}
	return union, nil
}

// hold sets, in memory, the bits of the regions rs has pending and marks them held until the
// resync releases them; every page is marked changed so the first flush rewrites the bitmap
// whole (bits left set by a clean shutdown are cleared with it).
func (b *bitmap) hold(rs *resyncSet) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.nbits {
		if rs != nil && rs.pending[r*b.regionStripes/rs.regionStripes].Load() {
			b.setLocked(r, true)
			b.held[r] = true
		}
	}
	for p := range b.dirtyPg {
		b.dirtyPg[p] = true
	}
	b.seq++
}

// clearAll clears every bit not held and with no write in flight and writes the bitmap; Close
// calls it after the final sync, before marking the array clean.
func (b *bitmap) clearAll() error {
	b.mu.Lock()
	for r := range b.nbits {
		if b.isSet(r) && !b.held[r] && b.inflight[r] == 0 {
			b.setLocked(r, false)
		}
	}
	b.mu.Unlock()
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	return b.flushLocked()
}

func (b *bitmap) stopCleaner() { b.stopOnce.Do(func() { close(b.stop) }) }
