package raid

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/raid5d/raid5d/stripe"
	"github.com/raid5d/raid5d/stripe/cache"
	"golang.org/x/sys/unix"
)

// memberOp is one member read or write of a stripe operation.
type memberOp struct {
	role  int
	buf   []byte
	off   int64 // absolute member offset
	write bool
	err   error // set by runOps
}

// runOps performs ops, concurrently when there are several, and returns the first error in
// op order as a *MemberError. The caller holds the stripe lock where the ops need it.
func (a *Array) runOps(ops []memberOp) error {
	do := func(op *memberOp) error { return a.memberIO(op.role, op.buf, op.off, op.write, true) }
	switch len(ops) {
	case 0:
		return nil
	case 1:
		return do(&ops[0])
	}
	var wg sync.WaitGroup
	for i := 1; i < len(ops); i++ {
		op := &ops[i]
		wg.Go(func() { op.err = do(op) })
	}
	ops[0].err = do(&ops[0])
	wg.Wait()
	for i := range ops {
		if ops[i].err != nil {
			return ops[i].err
		}
	}
	return nil
}

// check refuses ranges that are negative or end past the array.
func (a *Array) check(off, n int64) error {
	if off < 0 || n < 0 || off > a.size || n > a.size-off {
		return fmt.Errorf("%w: offset %d, length %d, array size %d", ErrOutOfRange, off, n, a.size)
	}
	return nil
}

func (a *Array) stripeLock(s int64) *sync.Mutex { return a.locks.For(s) }

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
	t0 := time.Now()
	n, err := readv(m.Member, bufs, off, iov)
	if d := time.Since(t0); err == nil && d > a.timeout {
		a.slowRead(m, off, d)
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
// lock. With a cache, whole stripes are written at once (parity from the new data alone) and the
// rest lands in the cache, to be written out later (Flush makes it durable); without one, every
// stripe is written with its parity before WriteAt returns. p is not kept. With StablePages,
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
// release runs. With StablePages and a cache, the whole aligned 4 KiB units of a partial-stripe
// write are kept by reference in the cache, not copied, until written out; release runs,
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

func (a *Array) writeAt(p []byte, off int64, pin *cache.Pin) (int, error) {
	if err := a.check(off, int64(len(p))); err != nil {
		return 0, err
	}
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
	if a.cache != nil {
		return a.cache.Write(p, off, a.stable || pin != nil, pin)
	}
	return a.write(p, off)
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

// write is WriteAt after the checks; the caller holds opMu for reading and has marked the array dirty.
func (a *Array) write(p []byte, off int64) (int, error) {
	ep := a.extents.Get().(*[]stripe.Extent)
	exts := a.layout.Extents((*ep)[:0], off, int64(len(p)))
	defer func() { *ep = exts[:0]; a.extents.Put(ep) }()
	sc := a.getScratch()
	defer a.putScratch(sc)
	for i := 0; i < len(exts); {
		j := i + 1
		for j < len(exts) && exts[j].Stripe == exts[i].Stripe {
			j++
		}
		if err := a.writeStripe(sc, p, exts[i:j]); err != nil {
			return int(exts[i].BufOff), err
		}
		i = j
	}
	return len(p), nil
}

// writeStripe writes the extents exts (all of one stripe, in order) from p and updates the
// stripe's parity, choosing among:
//   - full stripe: parity from the new data alone, no reads;
//   - reconstruct-write: read the untouched parts of the stripe, parity from all data;
//   - read-modify-write: read the old data and parity, fold the difference into parity;
//   - degraded with the missing data chunk written: read everything present, rebuild the
//     missing chunk, overlay the new data, recompute parity (the missing chunk's new data
//     lives in parity only).
//
// All work happens over R = [lo, hi), the in-chunk range covered by any extent.
func (a *Array) writeStripe(sc *scratch, p []byte, exts []stripe.Extent) error {
	s := exts[0].Stripe
	mu := a.stripeLock(s)
	mu.Lock()
	defer mu.Unlock()

	D, C := a.layout.DataMembers(), a.layout.ChunkSize()
	base := s * C // member offset (in the data area) of the stripe's chunks
	lo, hi := C, int64(0)
	var ext [stripe.MaxMembers]int // data index → index in exts, or -1
	for d := range D {
		ext[d] = -1
	}
	newBytes := int64(0)
	for i, e := range exts {
		w := e.MemberOff - base
		lo, hi = min(lo, w), max(hi, w+e.Len)
		ext[e.Data] = i
		newBytes += e.Len
	}
	L := hi - lo
	pm := a.layout.ParityMember(s)
	pOff := a.dataOffset + base + lo
	newData := func(e stripe.Extent) []byte { return p[e.BufOff : e.BufOff+e.Len] }

	reads := sc.ops[:0]
	defer func() { sc.ops = reads[:0] }()
	writeAll := func(P []byte) error {
		ops := reads[:0]
		for _, e := range exts { // memberIO skips a missing member
			ops = append(ops, memberOp{role: e.Member, buf: newData(e), off: a.dataOffset + e.MemberOff, write: true})
		}
		if P != nil {
			ops = append(ops, memberOp{role: pm, buf: P, off: pOff, write: true})
		}
		reads = ops
		var jops []intentOp
		if a.journaled() {
			jops = sc.jops[:0]
			for _, op := range ops {
				jops = append(jops, intentOp{role: op.role, off: op.off, buf: op.buf})
			}
			sc.jops = jops
		}
		return a.writeIntent(s, 1, jops, func() error { return a.runOps(ops) })
	}
	if a.usable(pm, s) == nil { // parity missing: the data is all there is
		return writeAll(nil)
	}
	shards := sc.shards[:D+1]
	P := sc.buf(D, C, L)
	shards[D] = P

	if newBytes == int64(D)*C { // full stripe
		for _, e := range exts {
			shards[e.Data] = newData(e)
		}
		if err := a.coder.Encode(shards); err != nil {
			return err
		}
		a.ctr.full.Add(1)
		return writeAll(P)
	}

	dm := -1 // data index of the missing member in this stripe
	if miss := a.missingAt(s); miss >= 0 {
		if a.lostAt(s) > 1 {
			return fmt.Errorf("%w: stripe %d", ErrArrayFailed, s)
		}
		dm = a.layout.DataIndex(s, miss)
	}
	rmw := dm >= 0 && ext[dm] < 0
	if dm < 0 {
		rcwBytes := int64(D)*L - newBytes
		rmw = newBytes+L < rcwBytes && !a.needsRCW(s)
	}

	if rmw {
		a.ctr.rmw.Add(1)
	} else {
		a.ctr.rcw.Add(1)
	}
	switch {
	case rmw:
		reads = append(reads, memberOp{role: pm, buf: P, off: pOff})
		for _, e := range exts {
			reads = append(reads, memberOp{role: e.Member, buf: sc.buf(e.Data, C, e.Len), off: a.dataOffset + e.MemberOff})
		}
		if err := a.runOps(reads); err != nil {
			return err
		}
		for _, e := range exts {
			w := e.MemberOff - base - lo
			if err := a.coder.Update(P[w:w+e.Len], sc.bufs[e.Data][:e.Len], newData(e)); err != nil {
				return err
			}
		}
		return writeAll(P)

	case dm >= 0: // degraded, the missing chunk is written: rebuild it, then recompute
		for d := range D {
			shards[d] = sc.buf(d, C, L)
			if d != dm {
				reads = append(reads, memberOp{role: a.layout.DataMember(s, d), buf: shards[d], off: pOff})
			}
		}
		reads = append(reads, memberOp{role: pm, buf: P, off: pOff})
		if err := a.runOps(reads); err != nil {
			return err
		}
		if err := a.coder.Reconstruct(shards, dm); err != nil {
			return err
		}
		for _, e := range exts {
			copy(shards[e.Data][e.MemberOff-base-lo:], newData(e))
		}

	default: // reconstruct-write: read what the write does not cover
		for d := range D {
			role := a.layout.DataMember(s, d)
			i := ext[d]
			if i >= 0 && exts[i].Len == L { // covers R: use the caller's bytes directly
				shards[d] = newData(exts[i])
				continue
			}
			buf := sc.buf(d, C, L)
			shards[d] = buf
			if i < 0 {
				reads = append(reads, memberOp{role: role, buf: buf, off: pOff})
				continue
			}
			e := exts[i]
			w := e.MemberOff - base - lo
			if w > 0 {
				reads = append(reads, memberOp{role: role, buf: buf[:w], off: pOff})
			}
			if end := w + e.Len; end < L {
				reads = append(reads, memberOp{role: role, buf: buf[end:], off: pOff + end})
			}
			copy(buf[w:], newData(e))
		}
		if err := a.runOps(reads); err != nil {
			return err
		}
	}
	if err := a.coder.Encode(shards); err != nil {
		return err
	}
	return writeAll(P)
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
		var errs []error
		var jops []intentOp
		if a.journaled() {
			for r := range a.roles.n() {
				jops = append(jops, intentOp{role: r, off: a.dataOffset + s*C, trim: n * C})
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
		write := a.write
		if a.cache != nil {
			write = func(p []byte, off int64) (int, error) { return a.cache.Write(p, off, true, nil) }
		}
		if _, err := write(zeroBuf[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}
