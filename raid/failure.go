package raid

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of IOOptions.MemberTimeout and IOOptions.ReadErrorLimit.
const (
	DefaultMemberTimeout  = 30 * time.Second
	DefaultReadErrorLimit = 20
)

// member is one member of the array as the array tracks it.
type member struct {
	Member
	sb *superblock // guarded by Array.sbMu
	// faulty: failed; never read or written again. rebuilding: a spare being rebuilt into its
	// role, usable only for stripes below the rebuild position (roleTable.rebuilt).
	faulty, rebuilding atomic.Bool
	// readd: the rebuilding member is a re-added one (ReAdd): the rebuild resyncs only the
	// pieces its map (roleTable.readd) says it may not hold.
	readd               atomic.Bool
	readErrs, writeErrs atomic.Uint64
	// The watchdog's record (hung.go): io counts the writes under way and completed; seenAt is
	// the first look that found writes under way with seenDone completed, zero if the last
	// found none. lookMu guards seenDone and seenAt.
	io       atomic.Int64
	lookMu   sync.Mutex
	seenDone int64
	seenAt   time.Time
	// abandoned counts writes (superblock, bitmap, sync) the array stopped waiting for
	// (eachMember) that have not returned yet: adding the member back must wait for them.
	abandoned atomic.Int32
	// byRequest: failed by Fail or Replace, an operator's decision that AutoReAdd respects.
	byRequest atomic.Bool
	// shrunk: failed because it was found smaller than at assembly (ErrMemberShrunk, a read
	// cut short): what it held past the cut is gone, so it is never re-added (a re-add
	// trusts its data outside the regions written while it was away), only added back.
	shrunk atomic.Bool
}

// releasePins, once the array has failed, gives back every caller buffer the stripe cache
// holds by reference (stable pages): its dirty stripes will never be written out, and the NBD
// server waits for its buffers before it ends a connection. The cache copies what they hold
// first (Cache.Unpin), so it stays readable until Close. recount calls it (roleTable.onFail) when it
// decides the array has failed; it runs on a goroutine of its own, once: fail may be called with a stripe
// lock held, and Unpin takes each of them.
func (a *Array) releasePins() {
	if a.cache == nil {
		return
	}
	a.unpinOnce.Do(func() { a.bgWG.Go(a.cache.Unpin) })
}

// memberWrite writes buf at off to m, which serves role, through the write gate; it returns
// errGateShut, writing nothing, once the array has failed.
func (a *Array) memberWrite(m *member, role int, buf []byte, off int64) (int, error) {
	if !a.roles.enter(role) {
		return 0, errGateShut
	}
	m.begin()
	n, err := m.WriteAt(buf, off)
	m.end()
	a.roles.leave(role)
	return n, err
}

// errGateShut is what a member write refused by the shut write gate returns: the array has
// failed (wrapped by writeRefused; never counted against the member).
var errGateShut = fmt.Errorf("%w: member writes refused", ErrArrayFailed)

// memberIO reads or writes buf at absolute member offset off of role, within one stripe,
// counting the bytes. locked says whether the caller holds that stripe's lock.
//
// A write to a role with no usable member is skipped: with every other write of the stripe
// done, the stripe is consistent without it (its chunk is what parity implies) — unless the
// stripe has lost two roles, then it fails with ErrArrayFailed. A write that fails marks the
// member faulty (recorded in the other superblocks before memberIO returns) and is then
// treated the same way. A read of a role with no usable member, or a read that fails (counted;
// past IOOptions.ReadErrorLimit the member is marked faulty), is rebuilt from the other members
// (the XOR of theirs at the same offsets), under the stripe lock. A read slower than the member
// timeout is counted the same way but its data is used (readMember).
func (a *Array) memberIO(role int, buf []byte, off int64, write, locked bool) error {
	s := (off - a.dataOffset) / a.layout.ChunkSize()
	m := a.roles.usable(role, s)
	if write {
		if m == nil {
			return a.skipWrite(role, s, nil)
		}
		n, err := a.memberWrite(m, role, buf, off)
		a.ctr.memberWrit.Add(uint64(n))
		if err == nil {
			return nil
		}
		if err == errGateShut {
			return fmt.Errorf("%w (stripe %d, role %d)", err, s, role)
		}
		m.writeErrs.Add(1)
		merr := memberErr(m, role, "write", off, err)
		a.fail(m, merr)
		return a.skipWrite(role, s, merr)
	}
	if m != nil {
		n, err := a.readMember(m, buf, off)
		a.ctr.memberRead.Add(uint64(n))
		if err == nil {
			return nil
		}
		a.readError(m, memberErr(m, role, "read", off, err))
	}
	return a.rebuildRange(role, s, buf, off, locked)
}

// skipWrite decides a write to role, which has no usable member in stripe s: nil if the
// stripe survives without it, else an ErrArrayFailed error (joined with cause).
func (a *Array) skipWrite(role int, s int64, cause error) error {
	if a.roles.lostAt(s) < 2 {
		return nil
	}
	return errors.Join(fmt.Errorf("%w: stripe %d lost role %d and another", ErrArrayFailed, s, role), cause)
}

// readError counts a failed read of m and marks m faulty past the read-error limit.
func (a *Array) readError(m *member, err error) {
	n := m.readErrs.Add(1)
	a.log.Warn("raid: member read failed; serving the data by reconstruction", "err", err, "read_errors", n)
	if n > uint64(a.readErrLimit) {
		a.fail(m, fmt.Errorf("%d read errors, more than the limit %d; last: %w", n, a.readErrLimit, err))
	}
}

// rebuildRange fills buf with role's bytes at member offset off (within stripe s) as the XOR
// of every other role's bytes there, taking s's lock unless locked.
func (a *Array) rebuildRange(role int, s int64, buf []byte, off int64, locked bool) error {
	if !locked {
		mu := a.locks.For(s)
		mu.Lock()
		defer mu.Unlock()
	}
	sc := a.getScratch()
	defer a.putScratch(sc)
	C := a.layout.ChunkSize()
	shards := sc.shards[:0]
	for r := range a.roles.n() {
		if r == role {
			continue
		}
		m := a.roles.usable(r, s)
		if m == nil {
			return fmt.Errorf("%w: stripe %d: roles %d and %d have no working member", ErrArrayFailed, s, role, r)
		}
		b := sc.buf(len(shards), C, int64(len(buf)))
		n, err := a.readMember(m, b, off)
		a.ctr.memberRead.Add(uint64(n))
		if err != nil {
			merr := memberErr(m, r, "read", off, err)
			m.readErrs.Add(1)
			return fmt.Errorf("%w: rebuilding role %d: %w", ErrArrayFailed, role, merr)
		}
		shards = append(shards, b)
	}
	shards = append(shards, buf)
	err := a.coder.Encode(shards) // the last is the XOR of the others
	clear(shards)
	return err
}

// fail marks m faulty, unless it already is: every other member's superblock records it
// (events bumped, synced) before fail returns, and writes that skip m wait for that record
// (awaitRecord) before they are acknowledged. A rebuild onto a spare starts if one is idle.
func (a *Array) fail(m *member, why error) {
	if errors.Is(why, ErrMemberShrunk) || errors.Is(why, ErrShortRead) {
		m.shrunk.Store(true)
	}
	// Marked faulty before sbMu is taken: I/O goes around m from now on (markFaulty counts it
	// in the role table at once; recount below makes the count exact), and an update of the superblocks still waiting for a
	// hung m gives up on it (eachMember), so failing a member never waits for the member.
	// Writes that skip m meanwhile wait for the record (awaitRecord): it is counted before m
	// is marked, so whoever sees m faulty also sees the record under way.
	a.records.begin()
	if a.roles.markFaulty(m) {
		a.records.end()
		a.awaitRecord() // the record of the first fail, then the drain if that failed the array
		return
	}
	a.sbMu.Lock()
	role := a.roles.roleOf(m)
	a.roles.recount()
	wasRebuilding := m.rebuilding.Load()
	a.log.Error("raid: member marked faulty", "member", m.Name(), "role", role, "why", why)
	// A member whose superblock cannot record this failure has failed too (md does the same):
	// if it stayed working, a write acknowledged without m — which awaitRecord lets return once
	// this is done — could be undone at the next assembly by that superblock, which still
	// calls m working, and m's stale chunks would be trusted. Each round marks at least one
	// more member faulty, so this ends.
	for bad, err := a.superblockWrite(nil); len(bad) > 0; bad, err = a.superblockWrite(nil) {
		a.log.Error("raid: recording a faulty member in the superblocks failed", "err", err)
		for _, b := range bad {
			if !a.roles.markFaulty(b) {
				r := a.roles.roleOf(b)
				wasRebuilding = wasRebuilding || b.rebuilding.Load()
				role = max(role, r)
				a.log.Error("raid: member marked faulty", "member", b.Name(), "role", r,
					"why", "its superblock could not record another member's failure")
			}
		}
		a.roles.recount()
	}
	failed := a.roles.failed() // decided by the recounts above, under sbMu
	a.sbMu.Unlock()
	a.records.end()
	if failed {
		a.roles.drain()
		a.log.Error("raid: array failed: two roles have no working member; data on them is lost; member writes stopped")
	}
	if wasRebuilding || role >= 0 {
		a.stopSync(wasRebuilding || failed) // a rebuild cannot go on in a failed array
	}
	a.maybeRebuild()
}

// readMember reads buf at off from m straight into buf, in the calling goroutine. With a member
// timeout (IOOptions.MemberTimeout > 0), a read that succeeds but takes longer is counted as a
// read error of m (slowRead) and its data is still returned: the read cannot be cancelled, so
// a hung member holds its caller until the system call returns (see doc.go # Caveats). The
// time is the watchdog's count of ticks (readTook), not a clock read: a read slower than the
// timeout by up to two ticks (a quarter of it) may pass.
func (a *Array) readMember(m *member, buf []byte, off int64) (int, error) {
	if a.timeout <= 0 {
		return a.readMemberNow(m, buf, off)
	}
	t0 := a.ticks.Load()
	n, err := a.readMemberNow(m, buf, off)
	if err == nil && a.ticks.Load() != t0 {
		if d := a.readTook(t0); d > a.timeout {
			a.slowRead(m, off, d)
		}
	}
	return n, err
}

// readMemberNow reads buf from m at off: a small read of a mapped member file is a copy from
// its mapping (no system call), anything else, or a copy that faults, m.ReadAt (readFull: a
// short read is ErrShortRead).
func (a *Array) readMemberNow(m *member, buf []byte, off int64) (int, error) {
	if a.mapReads && len(buf) <= MappedCopyMax {
		if fm, ok := m.Member.(mapper); ok && fm.CopyMapped(buf, off) {
			a.touchMapped(m, off, int64(len(buf)))
			return len(buf), nil
		}
	}
	return readFull(m.Member, buf, off)
}

// slowRead counts a read of m at off that took d, longer than the member timeout, as a read
// error (ErrTimeout) and marks m faulty past the read-error limit. The read's data was good.
func (a *Array) slowRead(m *member, off int64, d time.Duration) {
	n := m.readErrs.Add(1)
	err := fmt.Errorf("%w: took over %v, limit %v", memberErr(m, -1, "read", off, ErrTimeout), d, a.timeout)
	a.log.Warn("raid: member read slower than the member timeout; its data was used", "err", err, "read_errors", n)
	if n > uint64(a.readErrLimit) {
		a.fail(m, fmt.Errorf("%d read errors, more than the limit %d; last: %w", n, a.readErrLimit, err))
	}
}
