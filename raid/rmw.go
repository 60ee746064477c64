package raid

import (
	"runtime/debug"
	"sync"

	"github.com/raid5d/raid5d/stripe"
)

// Placed read-modify-writes (WriteCached, IOOptions.MappedWrites): a short write of whole
// 4 KiB units of one stripe that has no dirty units in the cache is done in place, in the
// caller's goroutine, instead of being copied into a cache head and written out later: old ^
// new is folded into the parity member's mapping, the old data read from the data member's
// mapping, and the new data is written to the data member with pwrite. One pwrite and one
// pass over memory per write, where the cache's write-out does two pwrites (data and parity)
// after copying the old data and parity out of the mappings, on another goroutine.
//
// The crash contract holds as for placed writes (placed.go): only the kernel copies data into
// a member (pwrite, which copies page by page, so a 4 KiB unit lands whole or not at all);
// the one store in user space is the parity's, which the write-intent bitmap covers (its
// region is dirty on disk before the first member write, TryBegin, so a resync after a crash
// recomputes the parity from the data). The parity is folded first, in one pass that reads
// the old data from the data member's mapping (where a separate copy of it first cost as much
// as the fold: both wait for memory), then the data is written.
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
//   - The parity store enters the parity role's write gate (nothing is stored into a member
//     of a failed array) and leaves it before the data is written (a failing data write
//     records the failure, which may drain the gate: it must not wait for us). A fault while
//     folding, or a file found afterwards not to cover its range any more (the data member's:
//     InFile, the parity member's: Covers), sends the write to the caller's ordinary path,
//     after the stripe's parity has been rewritten from the members (which still hold the old
//     data) through pread and pwrite, which meet the truncation as errors.
//   - The data goes through memberIO, as a write-out's does: the write gate, the hung-member
//     watchdog's count, the size guard of member files, and a failure fails the member (the
//     stripe then holds the new data in its parity, as a write-out's skipped write does).
//   - Concurrent mapped reads (ReadMapped) of the data may see old bytes, new bytes or a mix:
//     they are concurrent with the write, for which NBD promises nothing. Degraded reads,
//     which use parity, take the stripe lock.
//   - FUA writes never come here (the NBD server offers WriteCached no FUA write); a FLUSH
//     after the reply fdatasyncs every member, which writes back the pages the pwrite and the
//     parity store dirtied.
//
// Caveat: the caller (the NBD connection's reader) waits for the data's pwrite, a copy into
// the page cache that the kernel may throttle when dirty pages pile up for a slow disk; the
// connection's next requests wait with it, where a cached write would have let the reader go
// on. Members whose writes wait for a device or a network (O_DIRECT, remote) have no mapping
// and never come here.

// rmwState is one placed read-modify-write's scratch, pooled.
type rmwState struct {
	exts []stripe.Extent
	// By extent: the data member's mapping of it (the old data), the parity member's (where
	// old ^ new is folded in), and the data member, also as a mapper.
	old [stripe.MaxMembers][]byte
	par [stripe.MaxMembers][]byte
	mem [stripe.MaxMembers]*member
	dm  [stripe.MaxMembers]mapper
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
	if pm == nil || a.needsRCW(s) || a.roles.unrecorded(s, 1) {
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
		clear(st.old[:])
		clear(st.par[:])
		clear(st.mem[:])
		clear(st.dm[:])
		st.exts = st.exts[:0]
		rmwStates.Put(st)
	}()
	st.exts = a.layout.Extents(st.exts[:0], off, int64(len(p)))
	// The data and parity ranges of the members' mappings, all of their pages in memory (no
	// waiting for a disk, no store that allocates a page).
	for i := range st.exts {
		e := &st.exts[i]
		at := a.dataOffset + e.MemberOff
		m := a.roles.usable(e.Member, s)
		if m == nil {
			return false
		}
		dw, ok := m.Member.(mapWriter)
		dm, ok2 := m.Member.(mapper)
		if !ok || !ok2 {
			return false
		}
		if st.old[i] = dw.WritableRange(at, e.Len); st.old[i] == nil {
			return false
		}
		if st.par[i] = pw.WritableRange(at, e.Len); st.par[i] == nil {
			return false
		}
		st.mem[i], st.dm[i] = m, dm
	}
	if a.bm != nil {
		if !a.bm.TryBegin(s, 1) {
			return false // the region's bit is not on disk yet: the write-out will wait for it
		}
		defer a.bm.End(s, 1)
	}
	// First the parity: old ^ new folded in, the old data read from the data members'
	// mappings, in one pass. Then the files are checked: the data members' still held the
	// old bytes read (a truncated file's last page reads as zeroes past its new end), the
	// parity member's still holds the stores.
	if !a.roles.enter(pr) {
		return false // the array has failed
	}
	folded := a.foldParity(st, p) && st.inFile(a.dataOffset) && pw.Covers(a.dataOffset+(s+1)*a.layout.ChunkSize())
	a.roles.leave(pr)
	if !folded {
		// A page faulted or a file shrank: the parity is rewritten from the members (which
		// still hold the old data) through the ordinary member I/O, which reports what is
		// wrong and fails the member; the caller then writes p as usual.
		bufs := make([][]byte, a.roles.n()+1)
		for i := range bufs {
			bufs[i] = make([]byte, a.layout.ChunkSize())
		}
		a.scrubSpan(s, 1, bufs, true) // an error is the caller's write's too
		return false
	}
	// Then the data, through pwrite. A member that fails is failed and its write skipped: the
	// stripe's parity holds the new data.
	for i := range st.exts {
		e := &st.exts[i]
		if err := a.memberIO(e.Member, p[e.BufOff:e.BufOff+e.Len], a.dataOffset+e.MemberOff, true, true); err != nil {
			return false // the array has failed: the caller's write reports it
		}
	}
	a.ctr.memberWrit.Add(uint64(len(p)))
	a.ctr.mappedWrit.Add(uint64(len(p)))
	for i := range st.exts {
		e := &st.exts[i]
		a.touchMapped(pm, a.dataOffset+e.MemberOff, e.Len)
		a.touchMapped(st.mem[i], a.dataOffset+e.MemberOff, e.Len)
	}
	a.cache.CheckStripes(s, 1, "placed read-modify-write")
	a.ctr.rmw.Add(1)
	return true
}

// foldParity folds old ^ new of each of st's extents into its parity range, the old data read
// from the data member's mapping and the new from p, and reports false if a page faulted.
func (a *Array) foldParity(st *rmwState, p []byte) (ok bool) {
	defer func(was bool) {
		debug.SetPanicOnFault(was)
		if recover() != nil {
			ok = false
		}
	}(debug.SetPanicOnFault(true))
	for i := range st.exts {
		e := &st.exts[i]
		if err := a.coder.Update(st.par[i], st.old[i], p[e.BufOff:e.BufOff+e.Len]); err != nil {
			return false
		}
	}
	return true
}

// inFile reports whether each data member's file still covers the range st read its old data
// from (mapper.InFile); dataOffset is the array's.
func (st *rmwState) inFile(dataOffset int64) bool {
	for i := range st.exts {
		e := &st.exts[i]
		if !st.dm[i].InFile(st.dm[i].Mapping(), dataOffset+e.MemberOff+e.Len) {
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
