package raid

import (
	"runtime/debug"
	"sync"

	"github.com/raid5d/raid5d/stripe"
)

// Placed writes (PlaceWrite, CommitPlaced; IOOptions.MappedWrites): a write whose whole stripes
// the caller reads straight into the members' mappings, where the bytes will live, instead of
// into a buffer that is then copied there; the partial stripes at its ends too, unless the
// stripe cache holds dirty units of them (then those parts go to a scratch buffer and are
// written as ordinary writes after the stripes). The
// NBD server does it for the whole stripes of a WRITE whose bytes have already arrived in the
// socket, in pieces as they arrive (nbd.PlacedWriter, PlaceUnit: a stripe): the kernel's copy out of the socket is then the only copy of the data,
// and the parity of each stripe is computed from the mapped data into the parity member's
// mapping. An ordinary write copies the data twice (socket → request buffer, and pwrite's
// copy into the page cache); placed, once. Only the kernel copies into the mappings: a copy
// in user space could be cut anywhere by the daemon's death (SIGKILL) and tear a 4 KiB unit,
// where a socket read whose data has all arrived stops only at a page it cannot map.
//
// What keeps it correct — a placed write is a full-stripe write like any other, only where the
// bytes are read from differs:
//   - PlaceWrite takes the stripes' locks (ascending, LockSpan) and holds them until
//     CommitPlaced: no write-out, read, trim, rebuild or scrub of those stripes runs meanwhile.
//   - A partial stripe is placed only without dirty units in the cache (checked under its
//     lock), so its members hold its current data: its parity, computed from all of its data
//     chunks in the mappings, is right for the old bytes and the new. A clean head of it is
//     dropped (DropClean), as its units would go stale.
//   - It declines (the caller then writes as usual) unless every role has a working member in
//     every stripe of the span (not degraded, not being rebuilt there), every member is a
//     mapped file whose range is wholly in memory (so no store faults or allocates a page:
//     a hole on a full tmpfs would), the array is not journaled (a journal logs the data before
//     the members see it) and mapped writes are on.
//   - It enters the write gate of every role and the bitmap's regions (Begin) before it returns
//     the slices, so nothing is stored into a member of a failed array, and the regions are
//     dirty on disk before any byte lands; it leaves both in CommitPlaced (the gates before a
//     repair, below, whose member I/O enters them itself). The caller must
//     read the payload without waiting for its sender (the NBD server places only a payload
//     already received), so a failure's drain of the gate is not held up by a client.
//   - PlacedReceived computes the parity of the stripes whose bytes have all arrived while the
//     caller is still reading the rest (their data is then in the CPU's cache), and
//     CommitPlaced that of the others, from their data as it now is in the mappings:
//     all of the payload, or for a payload cut short (received < n: the caller's read failed;
//     the write is not acknowledged), the part that arrived — either way the stripes are
//     consistent when their locks are released. A complete write then drops the stripes'
//     cache heads (all overwritten); an incomplete one keeps them (their dirty data was
//     acknowledged and is written out over the torn stripes later, as usual).
//   - A fault while computing parity (a member file truncated in the window since its size was
//     checked) is caught (SetPanicOnFault), and so is a file that no longer covers the range
//     afterwards: the stripes' parity is then rewritten from the members through pread and
//     pwrite (scrubSpan's repair), which meet the truncation as errors.

// placement is one placed write of n bytes at off: stripes [s0, s0+k), their locks held, whose
// bytes of the write are placed — whole stripes, and the partial stripe at either end when it
// is placed too (an edge: see PlaceWrite) — and the parts of the write before and after them
// that are not (head, tail: shorter than a stripe each), which the caller reads into edge and
// CommitPlaced writes as ordinary writes after the stripes.
type placement struct {
	a       *Array
	s0, k   int64
	off     int64  // where the write begins
	n       int    // its length
	head    int    // bytes before the placed ones (stripe s0 whole or the head edge)
	tail    int    // bytes after them
	edge    []byte // scratch for the head and the tail, two stripes long
	entered uint64 // roles whose write gate was entered
	begun   bool   // the bitmap's Begin was called
	hot     int64  // stripes [s0, s0+hot) have their parity (PlacedReceived)
	faulted bool   // their parity faulted: commit rewrites it through the members
	// By role: the member's mapping of the span's chunks (contiguous on a member) and the
	// member, also as a mapWriter.
	ranges [stripe.MaxMembers][]byte
	mem    [stripe.MaxMembers]*member
	mw     [stripe.MaxMembers]mapWriter
	shards [][]byte // scratch for one stripe's chunks
}

var placements = sync.Pool{New: func() any { return new(placement) }}

// PlaceWrite prepares a write of the n bytes at off whose payload the caller will read straight
// into the members' mappings: it appends to vec the
// slices that take the bytes, in order, and returns them with a handle for CommitPlaced,
// which must follow exactly once, from any goroutine. ok false: the caller writes the bytes
// with WriteAt (or WritePinned) as usual; nothing was done. See "Placed writes" above for what
// it requires.
//
// The partial stripe at either end of the write (an edge: a 1 MiB write of 48 KiB stripes has
// 21 whole stripes and an edge at either end) is placed too when the stripe cache holds no
// dirty units of it (a clean head is dropped, DropClean): its parity is then computed from all
// of its data chunks in the mappings, the new bytes and the old around them (a
// reconstruct-write that reads memory, not the members). An edge with dirty units, whose
// members hold older data than the cache, goes to a scratch slice instead and is written as
// an ordinary write by CommitPlaced, after the stripes, joining the cache's head. A stream of
// sequential writes then places every byte: each shared stripe twice, a part each time. A
// write with no whole stripe (the NBD server's piece of a WRITE that has only partly arrived:
// its head up to the first stripe boundary, or its tail) is placed only if all of it can be.
func (a *Array) PlaceWrite(off int64, n int, vec [][]byte) (v [][]byte, h any, ok bool) {
	ss := a.layout.StripeSize()
	end := off + int64(n)
	s0, s1 := (off+ss-1)/ss, end/ss // the whole stripes: [s0, s1), none if s1 <= s0
	if !a.mapWrite || a.journaled() || n <= 0 || a.check(off, int64(n)) != nil || a.readdPending(off, int64(n)) {
		return vec, nil, false
	}
	// The edges to place: those without dirty units now (a hint, confirmed under the locks).
	// Within one stripe both are that stripe.
	needHead, needTail := off < s0*ss, end > s1*ss
	head, tail := needHead && !a.cache.Dirty(s0-1, 1), needTail && !a.cache.Dirty(s1, 1)
	if s1 <= s0 && (head != needHead || tail != needTail) {
		return vec, nil, false // nothing whole, and a part the cache holds newer data of
	}
	if head {
		s0--
	}
	if tail {
		s1++
	}
	a.opMu.RLock()
	if a.writable() != nil || a.markDirty() != nil {
		a.opMu.RUnlock()
		return vec, nil, false
	}
	pl := placements.Get().(*placement)
	pl.a, pl.s0, pl.k, pl.off, pl.n = a, s0, s1-s0, off, n
	pl.head, pl.tail = int(max(s0*ss, off)-off), int(end-min(s1*ss, end))
	a.locks.LockSpan(pl.s0, pl.k)
	// Under the locks no write can make an edge dirty; one may have since the hint: then
	// the ordinary write takes it all (rare).
	if !pl.prepare() || head && !a.cache.DropClean(s0) || tail && !a.cache.DropClean(s1-1) {
		pl.unlock()
		pl.put()
		return vec, nil, false
	}
	if int64(cap(pl.edge)) < 2*ss {
		pl.edge = make([]byte, 2*ss)
	}
	if pl.head > 0 {
		vec = append(vec, pl.edge[:pl.head])
	}
	C, D := a.layout.ChunkSize(), a.layout.DataMembers()
	lo, hi := pl.placed()
	for i := range pl.k {
		s := pl.s0 + i
		// The stripe's bytes of the placed range, from its start, and each data chunk's part.
		b0, b1 := max(lo, s*ss)-s*ss, min(hi, (s+1)*ss)-s*ss
		for d := range int64(D) {
			if c0, c1 := max(b0, d*C), min(b1, (d+1)*C); c0 < c1 {
				r := pl.ranges[a.layout.DataMember(s, int(d))][i*C:]
				vec = append(vec, r[c0-d*C:c1-d*C])
			}
		}
	}
	if pl.tail > 0 {
		vec = append(vec, pl.edge[ss:ss+int64(pl.tail)])
	}
	a.clientOps.Add(1)
	return vec, pl, true
}

// placed returns the array range whose bytes pl places: the write less its head and tail.
func (pl *placement) placed() (lo, hi int64) {
	return pl.off + int64(pl.head), pl.off + int64(pl.n-pl.tail)
}

// whole returns the stripes of pl wholly overwritten: all but placed edges (none, w0 == w1,
// for a write within one stripe).
func (pl *placement) whole() (w0, w1 int64) {
	ss := pl.a.layout.StripeSize()
	lo, hi := pl.placed()
	w0 = (lo + ss - 1) / ss
	return w0, max(w0, hi/ss)
}

// prepare finds every role's mapped range and enters the gates and the bitmap, or reports
// false; unlock undoes what it did either way.
func (pl *placement) prepare() bool {
	a := pl.a
	C := a.layout.ChunkSize()
	off, n := a.dataOffset+pl.s0*C, pl.k*C
	if a.roles.unrecorded(pl.s0, pl.k) {
		return false // the ordinary write records the rebuild's position first (recordBefore)
	}
	for r := range a.roles.n() {
		m := a.roles.usable(r, pl.s0)
		if m == nil || a.roles.usable(r, pl.s0+pl.k-1) != m {
			return false
		}
		mw, ok := m.Member.(mapWriter)
		if !ok {
			return false
		}
		if pl.ranges[r] = mw.WritableRange(off, n); pl.ranges[r] == nil {
			return false
		}
		pl.mem[r], pl.mw[r] = m, mw
	}
	for r := range a.roles.n() {
		if !a.roles.enter(r) {
			return false
		}
		pl.entered |= 1 << r
	}
	if a.bm != nil {
		pl.begun = true
		if err := a.bm.Begin(pl.s0, pl.k); err != nil {
			return false // the ordinary write meets the same error and reports it
		}
	}
	return true
}

// unlock leaves the bitmap and the gates and unlocks the stripes and opMu.
func (pl *placement) unlock() {
	a := pl.a
	if pl.begun {
		a.bm.End(pl.s0, pl.k)
	}
	pl.leaveGates()
	a.locks.UnlockSpan(pl.s0, pl.k)
	a.opMu.RUnlock()
}

// leaveGates leaves the write gates pl entered, once.
func (pl *placement) leaveGates() {
	for r := range pl.a.roles.n() {
		if pl.entered&(1<<r) != 0 {
			pl.a.roles.leave(r)
		}
	}
	pl.entered = 0
}

// put returns pl to the pool.
func (pl *placement) put() {
	clear(pl.ranges[:])
	clear(pl.mem[:])
	clear(pl.mw[:])
	clear(pl.shards)
	pl.a, pl.entered, pl.begun, pl.hot, pl.faulted, pl.n = nil, 0, false, 0, false, 0
	placements.Put(pl)
}

// PlaceUnit (nbd.PlacedWriter) is the unit PlaceWrite places: a stripe.
func (a *Array) PlaceUnit() int64 { return a.layout.StripeSize() }

// PlacedReceived (nbd.PlacedProgresser) computes the parity of the stripes of the placed write
// h whose bytes have all been read into its slices (received of them, in order), while they
// are still in the CPU's cache; CommitPlaced does the rest.
func (a *Array) PlacedReceived(h any, received int) {
	pl := h.(*placement)
	pos := pl.off + int64(received)
	done := min(max(pos/a.layout.StripeSize()-pl.s0, 0), pl.k)
	if _, hi := pl.placed(); pos >= hi { // a tail edge is done at the end
		done = pl.k
	}
	if done > pl.hot && !pl.faulted {
		pl.faulted = !pl.parity(pl.hot, done)
		pl.hot = done
	}
}

// CommitPlaced ends the placed write h (from PlaceWrite) after the caller has read received of
// its n bytes into the slices: it makes every stripe's parity match its data and releases the
// stripes. For a complete payload it returns the write's result; for an incomplete one (the
// caller's read failed and the write is not acknowledged) it returns nil once the stripes are
// consistent, or the error that kept them from it. last (whether the placed range ends the
// caller's request) does not matter to the array.
func (a *Array) CommitPlaced(h any, received int, _ bool) error {
	pl := h.(*placement)
	defer pl.put()
	ss := a.layout.StripeSize()
	err := pl.commit(received == pl.n)
	pl.unlock()
	lo, hi := pl.placed()
	a.cache.Arrived(lo, hi-lo) // the placed edges' expected writes (Expect) have landed
	a.awaitRecord()            // a failure the repair ran into is recorded
	if err != nil || received < pl.n {
		return err // cut short: the head and tail were never acknowledged, so not written
	}
	// The ends not placed, as ordinary writes (their stripes are not locked by the placement).
	if pl.head > 0 {
		if _, err := a.writeAt(pl.edge[:pl.head], pl.off, nil); err != nil {
			return err
		}
	}
	if pl.tail > 0 {
		if _, err := a.writeAt(pl.edge[ss:ss+int64(pl.tail)], hi, nil); err != nil {
			return err
		}
	}
	return nil
}

// commit makes the placed stripes' parity match their data, complete saying whether all of
// the payload arrived; the stripes are still locked.
func (pl *placement) commit(complete bool) error {
	a := pl.a
	C := a.layout.ChunkSize()
	w0, w1 := pl.whole()
	if complete {
		a.cache.Overwritten(w0, w1-w0) // the edges have no head (PlaceWrite)
	}
	// The stripes after hot, whole or not: a payload cut short leaves them consistent with
	// what arrived. Those before have theirs (PlacedReceived), whole. An edge's parity is
	// of all of its data, the new and the old.
	if pl.faulted || !pl.parity(pl.hot, pl.k) || !pl.covered() {
		// The range faulted or shrank: rewrite the parity through the ordinary member I/O,
		// which reports what is wrong (and fails the member). The gates are left first: the
		// stores into the mappings are over, the repair's member I/O enters them itself, and
		// a failure it runs into that fails the array drains them, which would wait for ever
		// for this placement's entries (TestPlacedRepairFailsArray).
		pl.leaveGates()
		bufs := make([][]byte, a.roles.n()+1)
		for i := range bufs {
			bufs[i] = make([]byte, pl.k*C)
		}
		if _, err := a.scrubSpan(pl.s0, pl.k, bufs, true); err != nil {
			return err
		}
	}
	lo, hi := pl.placed()
	if complete {
		a.cache.CheckStripes(pl.s0, pl.k, "placed write")
		a.ctr.placed.Add(uint64(hi - lo))
	}
	b := uint64(hi - lo + pl.k*C) // the data and every stripe's parity chunk
	a.ctr.memberWrit.Add(b)
	a.ctr.mappedWrit.Add(b)
	for r := range a.roles.n() {
		a.touchMapped(pl.mem[r], a.dataOffset+pl.s0*C, pl.k*C)
	}
	return nil
}

// parity computes the parity of stripes [s0+i0, s0+i1) from their data chunks in the mappings
// into the parity member's mapping, and reports false if a page faulted.
func (pl *placement) parity(i0, i1 int64) (ok bool) {
	a := pl.a
	C, D := a.layout.ChunkSize(), a.layout.DataMembers()
	if len(pl.shards) != D+1 {
		pl.shards = make([][]byte, D+1)
	}
	defer func(old bool) {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}(debug.SetPanicOnFault(true))
	for i := i0; i < i1; i++ {
		s := pl.s0 + i
		for d := range D {
			pl.shards[d] = pl.ranges[a.layout.DataMember(s, d)][i*C : (i+1)*C]
		}
		pl.shards[D] = pl.ranges[a.layout.ParityMember(s)][i*C : (i+1)*C]
		if err := a.coder.Encode(pl.shards); err != nil {
			return false
		}
	}
	return true
}

// covered reports whether every member's file still covers the placed range: a file cut short
// under the array since PlaceWrite checked (its stores past the new end were lost).
func (pl *placement) covered() bool {
	a := pl.a
	end := a.dataOffset + (pl.s0+pl.k)*a.layout.ChunkSize()
	for r := range a.roles.n() {
		if !pl.mw[r].Covers(end) {
			return false
		}
	}
	return true
}
