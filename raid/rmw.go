package raid

import (
	"runtime/debug"
	"sync"

	"github.com/raid5d/raid5d/stripe"
)

// Placed read-modify-writes (WriteCached, IOOptions.MappedWrites): a short write of whole
// 4 KiB units of one stripe that has no cache head is done in place, in the caller's
// goroutine, instead of being copied into a head and written out later: the old data is
// copied out of the data member's mapping, the new data is written to the data member with
// pwrite, and old ^ new is folded into the parity member's mapping. One pwrite and one
// store into memory per write, where the cache's write-out does two pwrites (data and
// parity) after copying the old data and parity out of the mappings, on another goroutine.
//
// The crash contract holds as for placed writes (placed.go): only the kernel copies data into
// a member (pwrite, which copies page by page, so a 4 KiB unit lands whole or not at all);
// the one store in user space is the parity's, which the write-intent bitmap covers (its
// region is dirty on disk before the first member write, TryBegin, so a resync after a crash
// recomputes the parity from the data).
//
// What keeps it correct:
//   - It runs under the stripe's lock (TryLock: it never waits for it) and only for a stripe
//     whose cache head, if any, has no dirty units (those are newer than the members): a
//     clean head is dropped (DropClean), as its units would go stale. No write-out, cached
//     write, read through the cache, trim, rebuild or scrub of the stripe runs meanwhile; a
//     head bound later reads the members after the write.
//   - It declines (the cache takes the write, or the caller writes as usual) unless the data
//     and parity roles of the stripe have working members (not degraded there, not being
//     rebuilt) that are mapped files whose ranges are wholly in memory, the stripe's parity is
//     trusted (not waiting for a resync: needsRCW), the array is not journaled, and mapped
//     writes are on.
//   - The data goes through memberIO, as a write-out's does: the write gate, the hung-member
//     watchdog's count, the size guard of member files, and a failure fails the member (the
//     stripe then holds the new data in its parity, as a write-out's skipped write does).
//   - The parity store enters the parity role's write gate (nothing is stored into a member
//     of a failed array) after the data writes have returned (a failing data write records
//     the failure, which may drain the gate: it must not wait for us). A fault while storing,
//     or a parity file that no longer covers the range afterwards (Covers), is repaired as a
//     placed write's is: the stripe's parity is rewritten from the members through pread and
//     pwrite, which meet the truncation as errors.
//   - Concurrent mapped reads (ReadMapped) of the data may see old bytes, new bytes or a mix:
//     they are concurrent with the write, for which NBD promises nothing. Degraded reads,
//     which use parity, take the stripe lock.
//   - FUA writes never come here (the NBD server offers WriteCached no FUA write); a FLUSH
//     after the reply fdatasyncs every member, which writes back the pages the pwrite and the
//     parity store dirtied.

// rmwState is one placed read-modify-write's scratch, pooled.
type rmwState struct {
	exts []stripe.Extent
	old  []byte                     // the old data of the write's extents, back to back
	par  [stripe.MaxMembers][]byte  // by extent: the parity mapping it folds into
	mem  [stripe.MaxMembers]*member // by extent: the data member
}

var rmwStates = sync.Pool{New: func() any { return new(rmwState) }}

// rmwPlaced does the write of p at off (whole 4 KiB units within one stripe, not all of it;
// the range checked, opMu held for reading, the array writable and marked dirty) as a placed
// read-modify-write and reports true, or reports false having written nothing (see "Placed
// read-modify-writes" above). It waits for nothing but its member writes (copies into the page
// cache): not for a lock, nor for the write-intent bitmap (a stripe whose region's bit is not
// yet on disk is declined, TryBegin).
func (a *Array) rmwPlaced(p []byte, off int64) bool {
	if !a.mapWrite || a.journaled() || a.roles.degraded() {
		return false
	}
	ok := a.rmwLocked(p, off)
	a.awaitRecord() // a failure a member write ran into is recorded
	return ok
}

// rmwLocked is rmwPlaced under the stripe's lock.
func (a *Array) rmwLocked(p []byte, off int64) bool {
	ss := a.layout.StripeSize()
	s := off / ss
	lk := a.locks.For(s)
	if !lk.TryLock() {
		return false
	}
	defer lk.Unlock()
	// Under the lock: a rebuild moving past s, the resync and a cache head's binding all
	// hold it to change what these say about s.
	pr := a.layout.ParityMember(s)
	pm := a.roles.usable(pr, s)
	if pm == nil || a.needsRCW(s) {
		return false
	}
	pw, ok := pm.Member.(mapWriter)
	if !ok {
		return false
	}
	if !a.cache.DropClean(s) {
		return false // dirty units in the cache, newer than the members
	}
	st := rmwStates.Get().(*rmwState)
	defer func() {
		clear(st.par[:])
		clear(st.mem[:])
		st.exts = st.exts[:0]
		rmwStates.Put(st)
	}()
	st.exts = a.layout.Extents(st.exts[:0], off, int64(len(p)))
	if cap(st.old) < len(p) {
		st.old = make([]byte, ss)
	}
	old := st.old[:len(p)]
	// The old data, copied out of the data members' mappings (resident pages only: no
	// waiting for a disk), and the parity's ranges.
	for i := range st.exts {
		e := &st.exts[i]
		at := a.dataOffset + e.MemberOff
		m := a.roles.usable(e.Member, s)
		if m == nil {
			return false
		}
		dw, ok := m.Member.(mapWriter)
		mp, ok2 := m.Member.(mapper)
		if !ok || !ok2 || dw.WritableRange(at, e.Len) == nil || !mp.CopyMapped(old[e.BufOff:e.BufOff+e.Len], at) {
			return false
		}
		if st.par[i] = pw.WritableRange(at, e.Len); st.par[i] == nil {
			return false
		}
		st.mem[i] = m
	}
	if a.bm != nil {
		if !a.bm.TryBegin(s, 1) {
			return false // the region's bit is not on disk yet: the write-out will wait for it
		}
		defer a.bm.End(s, 1)
	}
	// The new data, through pwrite. A member that fails is failed and its write skipped: the
	// parity below then holds the new data.
	for i := range st.exts {
		e := &st.exts[i]
		if err := a.memberIO(e.Member, p[e.BufOff:e.BufOff+e.Len], a.dataOffset+e.MemberOff, true, true); err != nil {
			return false // the array has failed: the caller's write reports it
		}
	}
	if !a.roles.enter(pr) {
		return false // failed meanwhile
	}
	// The parity member failed meanwhile (a watchdog): the stripe needs no parity.
	skip := a.roles.usable(pr, s) != pm
	stored := !skip && a.foldParity(st, p, old) && pw.Covers(a.dataOffset+(s+1)*a.layout.ChunkSize())
	a.roles.leave(pr)
	if !skip && !stored {
		// The range faulted or shrank: rewrite the parity through the ordinary member I/O,
		// which reports what is wrong (and fails the member).
		bufs := make([][]byte, a.roles.n()+1)
		for i := range bufs {
			bufs[i] = make([]byte, a.layout.ChunkSize())
		}
		if _, err := a.scrubSpan(s, 1, bufs, true); err != nil {
			return false
		}
	}
	if stored {
		a.ctr.memberWrit.Add(uint64(len(p)))
		a.ctr.mappedWrit.Add(uint64(len(p)))
		for i := range st.exts {
			e := &st.exts[i]
			a.touchMapped(pm, a.dataOffset+e.MemberOff, e.Len)
			a.touchMapped(st.mem[i], a.dataOffset+e.MemberOff, e.Len)
		}
	}
	a.cache.CheckStripes(s, 1, "placed read-modify-write")
	a.ctr.rmw.Add(1)
	return true
}

// foldParity folds old ^ new of each of st's extents into its parity range, and reports
// false if a page faulted.
func (a *Array) foldParity(st *rmwState, p, old []byte) (ok bool) {
	defer func(was bool) {
		debug.SetPanicOnFault(was)
		if recover() != nil {
			ok = false
		}
	}(debug.SetPanicOnFault(true))
	for i := range st.exts {
		e := &st.exts[i]
		if err := a.coder.Update(st.par[i], old[e.BufOff:e.BufOff+e.Len], p[e.BufOff:e.BufOff+e.Len]); err != nil {
			return false
		}
	}
	return true
}

// wholeUnits reports whether p at off is whole 4 KiB units (stripe.UnitSize) within one
// stripe, not all of it: the writes WriteCached takes.
func (a *Array) wholeUnits(p []byte, off int64) bool {
	ss, n := a.layout.StripeSize(), int64(len(p))
	return n > 0 && n < ss && off%stripe.UnitSize == 0 && n%stripe.UnitSize == 0 && off/ss == (off+n-1)/ss
}
