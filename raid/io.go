package raid

import (
	"errors"
	"fmt"
	"sync"

	"github.com/raid5d/raid5d/raid/internal/journal"
	"github.com/raid5d/raid5d/stripe"
	"github.com/raid5d/raid5d/stripe/cache"
	"golang.org/x/sys/unix"
)

// check refuses ranges that are negative or end past the array.
func (a *Array) check(off, n int64) error {
	if off < 0 || n < 0 || off > a.size || n > a.size-off {
		return fmt.Errorf("%w: offset %d, length %d, array size %d", ErrOutOfRange, off, n, a.size)
	}
	return nil
}

// ReadAt reads len(p) bytes at array offset off into p (io.ReaderAt). Units up to date in the
// stripe cache (including writes not yet written out) are copied from it; member reads go
// straight into p. A request that spans members reads each member's share on its own
// goroutine (an idle read worker, else the calling one), and a member's ranges that are
// contiguous on it and in stripes the cache does not hold are read in one preadv whose iovecs
// point into p. A missing member's chunks, and a chunk whose read fails while the array is
// otherwise whole, are rebuilt from the rest of their stripe.
// On error n is the length of the prefix of p known to be good.
func (a *Array) ReadAt(p []byte, off int64) (int, error) {
	if err := a.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return 0, ErrClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	a.clientOps.Add(1)
	ep := a.extents.Get().(*[]stripe.Extent)
	exts := a.layout.Extents((*ep)[:0], off, int64(len(p)))
	defer func() { *ep = exts[:0]; a.extents.Put(ep) }()

	if len(exts) == 1 { // one chunk: no hand-off
		if err := a.readPiece(p, exts[0]); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	st := readStates.Get().(*readState)
	st.a, st.p, st.exts, st.failOff, st.failErr = a, p, exts, int64(len(p)), nil
	st.s0 = exts[0].Stripe
	ns := exts[len(exts)-1].Stripe - st.s0 + 1
	st.cached = a.cachedStripes(st.s0, ns, st.cached)
	var touched uint64 // bit r: member r holds part of the request
	for _, e := range exts {
		touched |= 1 << e.Member
	}
	// Every member but the first to a read worker; those no idle worker takes, and the first,
	// are read here.
	var here uint64
	first := -1
	for r := range a.roles.n() {
		if touched&(1<<r) == 0 {
			continue
		}
		if first < 0 {
			first = r
			continue
		}
		if !a.handOff(st, r) {
			here |= 1 << r
		}
	}
	st.readRole(first)
	for r := range a.roles.n() {
		if here&(1<<r) != 0 {
			st.readRole(r)
		}
	}
	st.wg.Wait()
	n, err := len(p), st.failErr
	if err != nil {
		n = int(st.failOff)
	}
	st.a, st.p, st.exts, st.failErr = nil, nil, nil, nil
	readStates.Put(st)
	return n, err
}

// cachedStripes returns bits (grown as needed) with bit i (bit i%64 of word i/64) set for each
// stripe s0+i, i < n, that has a cache head: a read takes those stripes from the cache and may
// read the others from the members directly.
func (a *Array) cachedStripes(s0, n int64, bits []uint64) []uint64 {
	if w := int((n + 63) / 64); cap(bits) < w {
		bits = make([]uint64, w)
	} else {
		bits = bits[:w]
	}
	if a.cache != nil {
		a.cache.Heads(s0, n, bits)
	} else {
		clear(bits)
	}
	return bits
}

// readState is the state of one ReadAt that touches several members, shared by the goroutines
// that read its members' shares; pooled (readStates) with its scratch space.
type readState struct {
	a       *Array
	p       []byte
	exts    []stripe.Extent
	s0      int64    // exts[0].Stripe
	cached  []uint64 // bit i: stripe s0+i has a cache head (Cache.Heads)
	wg      sync.WaitGroup
	mu      sync.Mutex // guards failOff, failErr
	failOff int64      // the lowest BufOff of a failed extent, else len(p)
	failErr error
	scr     [stripe.MaxMembers]readScratch // by role: only that role's reader uses it
}

// readScratch is one member reader's space for a vectored read.
type readScratch struct {
	bufs [][]byte
	iov  []unix.Iovec
}

var readStates = sync.Pool{New: func() any { return new(readState) }}

// fail records an error of the extent at BufOff off, if it is the lowest so far.
func (st *readState) fail(off int64, err error) {
	st.mu.Lock()
	if off < st.failOff {
		st.failOff, st.failErr = off, err
	}
	st.mu.Unlock()
}

// readRole reads the request's extents on member r into p, in order, stopping at the first
// error. Runs of extents that are contiguous on the member, in stripes without a cache head,
// on the same usable member, are read with one vectored read (readRun); the others one by one
// through readPiece (the cache, or a rebuild for a member that is missing there).
func (st *readState) readRole(r int) {
	a, sc := st.a, &st.scr[r]
	bufs := sc.bufs[:0]
	defer func() { clear(bufs); sc.bufs = bufs[:0] }()
	var (
		i0     int     // index in exts of the run's first extent
		runM   *member // the member the run reads
		runOff int64   // member data-area offset of the run
		runEnd int64   // and of its end
	)
	for i := range st.exts {
		e := &st.exts[i]
		if e.Member != r {
			continue
		}
		var m *member
		if b := e.Stripe - st.s0; st.cached[b/64]&(1<<(b%64)) == 0 {
			m = a.roles.usable(r, e.Stripe)
		}
		if len(bufs) > 0 && (m != runM || e.MemberOff != runEnd || len(bufs) == maxIov) {
			if !st.readRun(r, runM, runOff, bufs, i0, i) {
				return
			}
			clear(bufs)
			bufs = bufs[:0]
		}
		dst := st.p[e.BufOff : e.BufOff+e.Len]
		if m == nil {
			if err := a.readPiece(dst, *e); err != nil {
				st.fail(e.BufOff, err)
				return
			}
			continue
		}
		if len(bufs) == 0 {
			i0, runM, runOff = i, m, e.MemberOff
		}
		bufs = append(bufs, dst)
		runEnd = e.MemberOff + e.Len
	}
	if len(bufs) > 0 {
		st.readRun(r, runM, runOff, bufs, i0, len(st.exts))
	}
}

// readRun reads bufs, the buffers of role r's extents among exts[i0:i1], from m at data-area
// offset off in one vectored read. If it fails, the extents are read again one by one through
// readExtent, which counts the member's errors and rebuilds what cannot be read. It reports
// whether every extent was read, recording the error otherwise.
func (st *readState) readRun(r int, m *member, off int64, bufs [][]byte, i0, i1 int) bool {
	a, sc := st.a, &st.scr[r]
	if len(bufs) > 1 {
		if cap(sc.iov) < len(bufs) {
			sc.iov = make([]unix.Iovec, 0, max(len(bufs), 64))
		}
		n, err := a.readMemberv(m, bufs, a.dataOffset+off, sc.iov)
		a.ctr.memberRead.Add(uint64(n))
		if err == nil {
			return true
		}
	}
	for j := i0; j < i1; j++ {
		e := st.exts[j]
		if e.Member != r {
			continue
		}
		if err := a.readExtent(st.p[e.BufOff:e.BufOff+e.Len], e); err != nil {
			st.fail(e.BufOff, err)
			return false
		}
	}
	return true
}

// readMemberv is readMember for a vectored read: a read slower than the member timeout is
// counted as a read error after it returns (its data is used).
func (a *Array) readMemberv(m *member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	if a.timeout <= 0 {
		return readv(m.Member, bufs, off, iov)
	}
	t0 := a.ticks.Load()
	n, err := readv(m.Member, bufs, off, iov)
	if err == nil && a.ticks.Load() != t0 {
		if d := a.readTook(t0); d > a.timeout {
			a.slowRead(m, off, d)
		}
	}
	return n, err
}

// readPiece reads one extent into dst: through the cache if there is one, else readExtent.
func (a *Array) readPiece(dst []byte, e stripe.Extent) error {
	if a.cache != nil {
		return a.cache.ReadExtent(dst, e, a.missFn)
	}
	return a.readExtent(dst, e)
}

// readExtent reads one extent from its member into dst, rebuilding it from the rest of its
// stripe when its member is missing or fails (memberIO).
func (a *Array) readExtent(dst []byte, e stripe.Extent) error {
	return a.memberIO(e.Member, dst, a.dataOffset+e.MemberOff, false, false)
}

// WriteAt writes p at array offset off (io.WriterAt), stripe by stripe, each under its stripe
// lock, through the stripe cache: whole stripes are written at once (parity from the new data
// alone) and the rest lands in the cache, to be written out later (Flush makes it durable);
// with StripeCache < 0 (no heads) every stripe is written with its parity before WriteAt
// returns. p is not kept. With StablePages,
// whole stripes are written straight from p, which must not change during the call; otherwise p
// is copied first and may change at any time. On error n is the length of the prefix of p whose
// stripes were written completely.
func (a *Array) WriteAt(p []byte, off int64) (int, error) {
	if a.unsafeRef {
		pin := cache.NewPin(nil)
		defer pin.Drop()
		return a.writeAt(p, off, pin)
	}
	return a.writeAt(p, off, nil)
}

// WritePinned is WriteAt for a pinned buffer (nbd.PinnedWriter): p stays unchanged until
// release runs. With StablePages, the whole aligned 4 KiB units of a partial-stripe write are
// kept by reference in the cache, not copied, until written out; release runs,
// exactly once, after the last member write that reads p has completed — possibly before
// WritePinned returns, and on error too. Otherwise it is WriteAt followed by release.
func (a *Array) WritePinned(p []byte, off int64, release func()) (int, error) {
	if a.cache == nil || !a.stable {
		defer release()
		return a.WriteAt(p, off)
	}
	pin := cache.NewPin(release)
	defer pin.Drop()
	return a.writeAt(p, off, pin)
}

// WriteCached (nbd.CachedWriter) is WriteAt (release nil) or WritePinned for a write it can do
// without waiting: a write of whole 4 KiB units within one stripe, not all of it, of an array
// already marked dirty, with no member failure being recorded and no lock of its own held by
// someone else: in place, as a placed read-modify-write (rmw.go: the stripe without dirty
// units in the cache, mapped writes on; p is not kept and release runs before WriteCached
// returns), or else into the stripe cache (Cache.WriteCached: the stripe's lock free, a head
// for it at hand). It reports whether it wrote p; false: nothing was done, release is not
// called, and the caller writes p with WriteAt or WritePinned, which report any error. With
// release non-nil and StablePages, a cached p is kept by reference as WritePinned keeps it,
// and release runs once the last write-out that reads it has completed. A cached write
// touches no member (the write-out does, later), so there is no failure for it to wait for; a
// placed one waits for the record of a failure its member writes ran into (awaitRecord).
func (a *Array) WriteCached(p []byte, off int64, release func()) bool {
	if a.cache == nil || len(p) == 0 || a.check(off, int64(len(p))) != nil || !a.dirty.Load() || a.records.n.Load() != 0 ||
		a.readdPending(off, int64(len(p))) {
		return false
	}
	if !a.opMu.TryRLock() {
		return false
	}
	defer a.opMu.RUnlock()
	if a.writable() != nil {
		return false
	}
	if a.wholeUnits(p, off) && a.rmwPlaced(p, off) { // placed in the members: rmw.go
		if release != nil {
			release()
		}
		a.clientOps.Add(1)
		return true
	}
	if !a.cache.WriteCached(p, off, a.stable, release) {
		return false
	}
	a.clientOps.Add(1)
	return true
}

// ExpectWrite (nbd.WriteExpecter) tells the stripe cache that a write of n bytes at off is
// coming, so that the partial stripes at its edges, if their heads hold another write's part,
// wait for it rather than be written out by a read-modify-write or reconstruct-write when
// their write-back delay runs out (cache.Expect).
func (a *Array) ExpectWrite(off, n int64) {
	if a.cache != nil && a.check(off, n) == nil {
		a.cache.Expect(off, n)
	}
}

// writeAt is WriteAt and WritePinned (pin non-nil): it checks the request, marks the array
// dirty before the first member write (markDirty), hands p to the stripe cache, the only write
// path (Cache.Write: stripe by stripe, whole stripes at once, the rest into heads), and before
// returning waits until any member failure the write ran into is recorded (awaitRecord).
func (a *Array) writeAt(p []byte, off int64, pin *cache.Pin) (int, error) {
	if err := a.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	a.awaitReAdd(off, int64(len(p)))
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if err := a.writable(); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := a.markDirty(); err != nil {
		return 0, err
	}
	a.clientOps.Add(1)
	defer a.awaitRecord()
	return a.cache.Write(p, off, a.stable || pin != nil, pin)
}

// writable reports why the array cannot be written, if it cannot. The caller holds opMu.
func (a *Array) writable() error {
	if a.closed {
		return ErrClosed
	}
	if a.readOnly {
		return ErrReadOnly
	}
	if a.roles.failed() {
		// A fast-path refusal: past this check the gate refuses every member write of a
		// failed array, so a write racing the failure fails there or lands only in the cache
		// (never written out; its FLUSH or FUA reports the failure).
		return ErrArrayFailed
	}
	return nil
}

// WriteAtFUA is WriteAt, then a write-out of the cached stripes it touched and an fdatasync of
// every member: the write is durable on return.
func (a *Array) WriteAtFUA(p []byte, off int64) (int, error) {
	n, err := a.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return n, ErrClosed
	}
	if a.cache != nil {
		if err := a.cache.FlushRange(off, int64(len(p))); err != nil {
			return n, err
		}
	}
	return n, a.awaitDurable(a.syncMembers())
}

// Trim discards [off, off+length): afterwards it reads as zeroes. Whole stripes are trimmed on
// every member (members read trimmed ranges as zeroes, so parity stays consistent); the partial
// stripes at either end are written with zeroes through the normal write path.
func (a *Array) Trim(off, length int64) error {
	return a.zeroRange(off, length, false)
}

// WriteZeroes makes [off, off+length) read as zeroes. Without noHole it is Trim; with noHole
// it writes zeroes, so the members' space stays allocated.
func (a *Array) WriteZeroes(off, length int64, noHole bool) error {
	return a.zeroRange(off, length, noHole)
}

func (a *Array) zeroRange(off, length int64, noHole bool) error {
	if err := a.check(off, length); err != nil {
		return err
	}
	a.awaitReAdd(off, length)
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if err := a.writable(); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	if err := a.markDirty(); err != nil {
		return err
	}
	a.clientOps.Add(1)
	defer a.awaitRecord()
	if noHole {
		return a.writeZeroes(off, length)
	}
	ss := a.layout.StripeSize()
	first := (off + ss - 1) / ss // first whole stripe
	end := (off + length) / ss   // end of whole stripes
	if first >= end {
		return a.writeZeroes(off, length)
	}
	if head := first*ss - off; head > 0 {
		if err := a.writeZeroes(off, head); err != nil {
			return err
		}
	}
	C := a.layout.ChunkSize()
	for s := first; s < end; s += nLocks {
		n := min(nLocks, end-s)
		a.locks.LockSpan(s, n) // in ascending lock order, as every holder of several (Array.locks)
		a.recordBefore(s, n)
		var errs []error
		var jops []journal.Op
		if a.journaled() {
			for r := range a.roles.n() {
				jops = append(jops, journal.Op{Role: r, Off: a.dataOffset + s*C, Trim: n * C})
			}
		}
		ierr := a.writeIntent(s, n, jops, func() error {
			for r := range a.roles.n() {
				if m := a.roles.working(r); m != nil {
					moff := a.dataOffset + s*C
					if !a.roles.enter(r) {
						errs = append(errs, fmt.Errorf("%w (trim of stripes %d-%d)", errGateShut, s, s+n-1))
						break
					}
					m.begin()
					err := m.Trim(moff, n*C)
					m.end()
					a.roles.leave(r)
					if err != nil {
						merr := memberErr(m, r, "trim", moff, err)
						m.writeErrs.Add(1)
						a.fail(m, merr)
						errs = append(errs, a.skipWrite(r, s, merr))
					}
				}
			}
			return nil
		})
		errs = append(errs, ierr)
		// Only now forget the cached stripes: until the members read as zeroes, a read that
		// finds no cache head would see data older than the last writes.
		if a.cache != nil {
			a.cache.Discard(s, n)
		}
		a.locks.UnlockSpan(s, n)
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	if tail := off + length - end*ss; tail > 0 {
		return a.writeZeroes(end*ss, tail)
	}
	return nil
}

// writeZeroes writes zeroes from the shared zero buffer (never written, so stable); the caller
// holds opMu.
func (a *Array) writeZeroes(off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroBuf)))
		if _, err := a.cache.Write(zeroBuf[:n], off, true, nil); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}
