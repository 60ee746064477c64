package raid

import (
	"runtime/debug"
	"sync"

	"github.com/raid5d/raid5d/stripe"
)

// Placed writes (PlaceWrite, CommitPlaced): a write of whole stripes whose payload the caller
// reads straight into the members' mappings, where the bytes will live, instead of into a
// buffer that is then copied there. The NBD server does it for a WRITE whose payload has
// already arrived in the socket (nbd.PlacedWriter): the kernel's copy out of the socket is then
// the only copy of the data, and the parity of each stripe is computed from the mapped data
// into the parity member's mapping. With mapped writes (IOOptions.MappedWrites) the data would
// be copied twice (socket → buffer → mapping); placed, once.
//
// What keeps it correct — a placed write is a full-stripe write like any other, only where the
// bytes are read from differs:
//   - PlaceWrite takes the stripes' locks (ascending, LockSpan) and holds them until
//     CommitPlaced: no write-out, read, trim, rebuild or scrub of those stripes runs meanwhile.
//   - It declines (the caller then writes as usual) unless every role has a working member in
//     every stripe of the span (not degraded, not being rebuilt there), every member is a
//     mapped file whose range is wholly in memory (so no store faults or allocates a page:
//     a hole on a full tmpfs would), the array is not journaled (a journal logs the data before
//     the members see it) and mapped writes are on.
//   - It enters the write gate of every role and the bitmap's regions (Begin) before it returns
//     the slices, so nothing is stored into a member of a failed array, and the regions are
//     dirty on disk before any byte lands; it leaves both in CommitPlaced. The caller must
//     read the payload without waiting for its sender (the NBD server places only a payload
//     already received), so a failure's drain of the gate is not held up by a client.
//   - CommitPlaced computes every stripe's parity from its data as it now is in the mappings:
//     all of the payload, or for a payload cut short (received < n: the caller's read failed;
//     the write is not acknowledged), the part that arrived — either way the stripes are
//     consistent when their locks are released. A complete write then drops the stripes'
//     cache heads (all overwritten); an incomplete one keeps them (their dirty data was
//     acknowledged and is written out over the torn stripes later, as usual).
//   - A fault while computing parity (a member file truncated in the window since its size was
//     checked) is caught (SetPanicOnFault), and so is a file that no longer covers the range
//     afterwards: the stripes' parity is then rewritten from the members through pread and
//     pwrite (scrubSpan's repair), which meet the truncation as errors.

// placement is one placed write: stripes [s0, s0+k), their locks held.
type placement struct {
	a       *Array
	s0, k   int64
	entered uint64 // roles whose write gate was entered
	begun   bool   // the bitmap's Begin was called
	// By role: the member's mapping of the span's chunks (contiguous on a member) and the
	// member as a mapWriter.
	ranges [stripe.MaxMembers][]byte
	mw     [stripe.MaxMembers]mapWriter
	shards [][]byte // scratch for one stripe's chunks
}

var placements = sync.Pool{New: func() any { return new(placement) }}

// PlaceWrite prepares a write of the n bytes at off, whole stripes, whose payload the caller
// will read straight into the members' mappings: it appends to vec the slices that take the
// bytes, in order, and returns them with a handle for CommitPlaced, which must follow exactly
// once, from any goroutine. ok false: the caller writes the bytes with WriteAt (or
// WritePinned) as usual; nothing was done. See "Placed writes" above for what it requires.
func (a *Array) PlaceWrite(off int64, n int, vec [][]byte) (v [][]byte, h any, ok bool) {
	ss := a.layout.StripeSize()
	if !a.mapWrite || a.journaled() || n <= 0 || off%ss != 0 || int64(n)%ss != 0 || a.check(off, int64(n)) != nil {
		return vec, nil, false
	}
	a.opMu.RLock()
	if a.writable() != nil || a.markDirty() != nil {
		a.opMu.RUnlock()
		return vec, nil, false
	}
	pl := placements.Get().(*placement)
	pl.a, pl.s0, pl.k = a, off/ss, int64(n)/ss
	a.locks.LockSpan(pl.s0, pl.k)
	if !pl.prepare() {
		pl.release()
		return vec, nil, false
	}
	C, D := a.layout.ChunkSize(), a.layout.DataMembers()
	for i := range pl.k {
		s := pl.s0 + i
		for d := range D {
			vec = append(vec, pl.ranges[a.layout.DataMember(s, d)][i*C:(i+1)*C])
		}
	}
	a.clientOps.Add(1)
	return vec, pl, true
}

// prepare finds every role's mapped range and enters the gates and the bitmap, or reports
// false; release undoes what it did either way.
func (pl *placement) prepare() bool {
	a := pl.a
	C := a.layout.ChunkSize()
	off, n := a.dataOffset+pl.s0*C, pl.k*C
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
		pl.mw[r] = mw
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

// release leaves the bitmap and the gates, unlocks the stripes and returns pl to the pool.
func (pl *placement) release() {
	a := pl.a
	if pl.begun {
		a.bm.End(pl.s0, pl.k)
	}
	for r := range a.roles.n() {
		if pl.entered&(1<<r) != 0 {
			a.roles.leave(r)
		}
	}
	a.locks.UnlockSpan(pl.s0, pl.k)
	a.opMu.RUnlock()
	clear(pl.ranges[:])
	clear(pl.mw[:])
	clear(pl.shards)
	pl.a, pl.entered, pl.begun = nil, 0, false
	placements.Put(pl)
}

// CommitPlaced ends the placed write h (from PlaceWrite) after the caller has read received of
// its n bytes into the slices: it makes every stripe's parity match its data and releases the
// stripes. For a complete payload it returns the write's result; for an incomplete one (the
// caller's read failed and the write is not acknowledged) it returns nil once the stripes are
// consistent, or the error that kept them from it.
func (a *Array) CommitPlaced(h any, received int) error {
	pl := h.(*placement)
	defer a.awaitRecord() // after release: a failure the repair ran into is recorded
	defer pl.release()
	C := a.layout.ChunkSize()
	complete := int64(received) == pl.k*a.layout.StripeSize()
	if complete {
		a.cache.Overwritten(pl.s0, pl.k)
	}
	if !pl.parity() {
		// The range faulted or shrank: rewrite the parity through the ordinary member I/O,
		// which reports what is wrong (and fails the member).
		bufs := make([][]byte, a.roles.n()+1)
		for i := range bufs {
			bufs[i] = make([]byte, pl.k*C)
		}
		if _, err := a.scrubSpan(pl.s0, pl.k, bufs, true); err != nil {
			return err
		}
	}
	if complete {
		a.cache.CheckStripes(pl.s0, pl.k, "placed write")
		a.ctr.placed.Add(uint64(received))
	}
	b := uint64(pl.k * C * int64(a.roles.n()))
	a.ctr.memberWrit.Add(b)
	a.ctr.mappedWrit.Add(b)
	if a.mapServed.Add(int64(b)) >= remapEvery {
		a.remapAll()
	}
	return nil
}

// parity computes each stripe's parity from its data chunks in the mappings into the parity
// member's mapping, and reports false if a page faulted or a member's file no longer covers
// the range.
func (pl *placement) parity() (ok bool) {
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
	for i := range pl.k {
		s := pl.s0 + i
		for d := range D {
			pl.shards[d] = pl.ranges[a.layout.DataMember(s, d)][i*C : (i+1)*C]
		}
		pl.shards[D] = pl.ranges[a.layout.ParityMember(s)][i*C : (i+1)*C]
		if err := a.coder.Encode(pl.shards); err != nil {
			return false
		}
	}
	end := a.dataOffset + (pl.s0+pl.k)*C
	for r := range a.roles.n() {
		if !pl.mw[r].Covers(end) {
			return false
		}
	}
	return true
}
