package raid

import (
	"errors"
	"fmt"
	"sync"

	"github.com/raid5d/raid5d/stripe"
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

// lockSpan locks the stripes [s0, s0+n), n ≤ nLocks, in ascending lock order; unlockSpan
// releases them. It is the only place that holds more than one stripe lock, so the fixed
// order is enough to rule out deadlock (the cache takes other stripes' locks only with TryLock).
func (a *Array) lockSpan(s0, n int64)   { a.locks.LockSpan(s0, n) }
func (a *Array) unlockSpan(s0, n int64) { a.locks.UnlockSpan(s0, n) }

// ReadAt reads len(p) bytes at array offset off into p (io.ReaderAt). Units up to date in the
// stripe cache (including writes not yet written out) are copied from it; member reads go
// straight into p, one goroutine per member touched. A missing member's chunks, and a chunk whose read
// fails while the array is otherwise whole, are rebuilt from the rest of their stripe.
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

	if len(exts) == 1 { // one chunk: no goroutines
		if err := a.readPiece(p, exts[0]); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	var touched uint64 // bit r: member r holds part of the request
	for _, e := range exts {
		touched |= 1 << e.Member
	}
	st := readStates.Get().(*readState)
	st.a, st.p, st.exts, st.failOff = a, p, exts, int64(len(p))
	last := -1
	for r := range a.roles {
		if touched&(1<<r) == 0 {
			continue
		}
		if last >= 0 {
			st.wg.Add(1)
			go st.readRoleDone(last)
		}
		last = r
	}
	st.readRole(last)
	st.wg.Wait()
	n, err := len(p), st.failErr
	if err != nil {
		n = int(st.failOff)
	}
	*st = readState{}
	readStates.Put(st)
	return n, err
}

// readState is the state of one ReadAt that touches several members, shared by its member
// goroutines; pooled (readStates).
type readState struct {
	a       *Array
	p       []byte
	exts    []stripe.Extent
	wg      sync.WaitGroup
	mu      sync.Mutex // guards failOff, failErr
	failOff int64      // the lowest BufOff of a failed extent, else len(p)
	failErr error
}

var readStates = sync.Pool{New: func() any { return new(readState) }}

// readRole reads the request's extents on member r into p, in order, stopping at the first
// error (recorded if it is the lowest so far).
func (st *readState) readRole(r int) {
	for _, e := range st.exts {
		if e.Member != r {
			continue
		}
		if err := st.a.readPiece(st.p[e.BufOff:e.BufOff+e.Len], e); err != nil {
			st.mu.Lock()
			if e.BufOff < st.failOff {
				st.failOff, st.failErr = e.BufOff, err
			}
			st.mu.Unlock()
			return
		}
	}
}

// readRoleDone is readRole on its own goroutine.
func (st *readState) readRoleDone(r int) {
	st.readRole(r)
	st.wg.Done()
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
		pin := stripe.NewPin(nil)
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
	pin := stripe.NewPin(release)
	defer pin.Drop()
	return a.writeAt(p, off, pin)
}

func (a *Array) writeAt(p []byte, off int64, pin *stripe.Pin) (int, error) {
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
	if a.failed() {
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
	err = a.syncMembers()
	a.awaitRecord()
	return n, err
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
		a.lockSpan(s, n)
		var errs []error
		var jops []intentOp
		if a.journaled() {
			for r := range a.roles {
				jops = append(jops, intentOp{role: r, off: a.dataOffset + s*C, trim: n * C})
			}
		}
		ierr := a.writeIntent(s, n, jops, func() error {
			for r := range a.roles {
				if m := a.roles[r].Load(); m != nil && !m.faulty.Load() {
					moff := a.dataOffset + s*C
					if err := m.Trim(moff, n*C); err != nil {
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
		a.unlockSpan(s, n)
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
