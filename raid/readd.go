package raid

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
)

// ReAdd brings back a member that failed, was removed, or was missing at assembly, with its
// superblock intact (mdadm --re-add): instead of a full rebuild, only the regions whose
// write-intent bits are set — those written while it was away, which the bitmap keeps while
// a role is missing — are resynced onto it. name is the member's path (or a spec, a remote
// member's URI) or, for a failed member the array still knows, its role number. It opens the
// member (a local file the array still holds is reused; a remote member is connected to
// afresh, its old connection having broken when it failed), matches its superblock and starts
// the resync; the member serves the stripes below the resync position, as a rebuilding spare
// does, and becomes active when it ends (Status().Sync, then LastRebuild: ReAdd, Resynced).
//
// Refused with ErrCannotReAdd (see there) when the bitmap cannot bridge the member's
// absence (with ErrForeignMember too for another array's member, ErrStaleMember for one whose
// events are older than the bitmap's last clear), ErrMemberBusy for a member failed hung whose writes are still under way, and
// the AddSpare errors for a path that is another member.
func (a *Array) ReAdd(name string) error {
	return a.reAddLocked(func() error { return a.reAddName(name) })
}

// ReAddMember is ReAdd on a member already open (any kind). On success the array owns m.
func (a *Array) ReAddMember(m Member) error {
	return a.reAddLocked(func() error {
		if err := a.checkNewMember(m.Name()); err != nil {
			return err
		}
		return a.reAdd(m, nil)
	})
}

// reAddLocked runs fn with opMu and mgmtMu held, if the array takes writes.
func (a *Array) reAddLocked(fn func() error) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if err := a.writable(); err != nil {
		return err
	}
	a.mgmtMu.Lock()
	defer a.mgmtMu.Unlock()
	return fn()
}

// reAddName is ReAdd with opMu and mgmtMu held. A failed member the array still holds is
// re-added with the Member it has if that is a local file (a second open would meet its own
// lock); any other is opened afresh: a remote member's old connection broke, or was closed at
// a deadline, when it failed.
func (a *Array) reAddName(name string) error {
	a.sbMu.Lock()
	old, err := a.awayMember(name)
	a.sbMu.Unlock()
	if err != nil {
		return err
	}
	switch {
	case old != nil && SpecPath(old.Name()) != "":
		if err := checkAbandoned(old); err != nil {
			return err
		}
		return a.reAdd(old.Member, old)
	case old != nil:
		name = old.Name() // name may be its role
	default:
		if err := a.checkNewMember(name); err != nil {
			return err
		}
	}
	m, err := a.openNew(name)
	if err != nil {
		return &MemberError{Member: name, Role: -1, Op: "open", Off: -1, Err: err}
	}
	if err := a.reAddWith(name, m); err != nil {
		m.Close()
		return err
	}
	return nil
}

// reAddWith re-adds m, just opened from the spec name, with opMu and mgmtMu held: in place of
// the member of that name the array still holds (which it then closes at Close), if any. On
// success the array owns m.
func (a *Array) reAddWith(name string, m Member) error {
	a.sbMu.Lock()
	old, err := a.awayMember(name)
	a.sbMu.Unlock()
	if err != nil {
		return err
	}
	if old != nil {
		if err := checkAbandoned(old); err != nil {
			return err
		}
	} else if err := a.checkNewMember(name); err != nil {
		return err
	}
	return a.reAdd(m, old)
}

// checkAbandoned refuses, with ErrMemberBusy, to re-add a member failed hung whose writes are
// still under way: one could land after the resync, over what it wrote.
func checkAbandoned(old *member) error {
	if n := old.abandoned.Load(); n > 0 {
		return fmt.Errorf("%w: %s still has %d writes under way from before it failed; re-add it when they have finished", ErrMemberBusy, old.Name(), n)
	}
	return nil
}

// awayMember returns the member name names if the array still holds it while it is away
// (faulty, in its role or not, or removed), nil if the array does not know it. A working
// member or spare is refused (ErrCannotReAdd). The caller holds sbMu.
func (a *Array) awayMember(name string) (*member, error) {
	name = specName(name)
	if r, err := strconv.Atoi(name); err == nil {
		if r >= 0 && r < a.roles.n() {
			if m := a.roles.member(r); m != nil && m.faulty.Load() {
				return m, nil
			}
		}
		return nil, fmt.Errorf("%w: role %s has no faulty member to re-add (name it by its path)", ErrNoSuchMember, name)
	}
	for _, m := range a.all() {
		if m.Name() == name {
			if !m.faulty.Load() {
				return nil, &MemberError{Member: name, Role: a.roles.roleOf(m), Op: "re-add", Off: -1,
					Err: fmt.Errorf("%w: it is a working member or a spare of the array", ErrCannotReAdd)}
			}
			return m, nil
		}
	}
	for _, m := range slices.Backward(a.retired) {
		if m.Name() == name {
			return m, nil
		}
	}
	return nil, nil
}

// reAdd matches m's superblock against the array and, if the bitmap can bridge its absence,
// puts it in its role as a rebuilding member that resyncs only the bitmap's regions. old is
// the array's earlier member for m, if it still holds one: it is dropped, unclosed if m is its
// Member, else kept with the retired members until Close (I/O begun before it failed may
// still use it). opMu and mgmtMu are held.
func (a *Array) reAdd(m Member, old *member) error {
	sb, err := readSuperblock(m)
	refuse := func(role int, format string, args ...any) error {
		return &MemberError{Member: m.Name(), Role: role, Op: "re-add", Off: SuperblockOffset,
			Err: fmt.Errorf("%w: "+format, append([]any{ErrCannotReAdd}, args...)...)}
	}
	if err != nil {
		return refuse(-1, "no superblock to match: %w", err)
	}
	if m.Size() < a.dataOffset+a.memberData {
		return refuse(sb.Role, "%d bytes, the array needs %d on each member", m.Size(), a.dataOffset+a.memberData)
	}
	// Every stripe's lock, until the member's map is durable and in force: no write that
	// left the member out is under way while the map is taken from the bits, and none
	// reaches the member before a restart would know where it is whole.
	stripes := a.memberData / a.layout.ChunkSize()
	a.locks.LockSpan(0, stripes)
	locked := true
	defer func() {
		if locked {
			a.locks.UnlockSpan(0, stripes)
		}
	}()
	// The cache's dirty heads out first, without the member: each sets its region's bit, so
	// the map has it, and no write the cache holds is left to write around the member later.
	if err := a.writeOutSpan(0, stripes); err != nil {
		return err
	}
	a.sbMu.Lock()
	r := sb.Role
	switch {
	case sb.ArrayUUID != a.uuid:
		err = refuse(r, "%w: array %s, not %s", ErrForeignMember, sb.ArrayUUID, a.uuid)
	case a.bm == nil:
		err = refuse(r, "the array has no write-intent bitmap")
	case r < 0 || r >= a.roles.n():
		err = refuse(r, "it was a spare, with no role to come back to")
	case a.roles.working(r) != nil:
		err = refuse(r, "role %d is held by %s", r, a.roles.working(r).Name())
	case old != nil && old.shrunk.Load():
		err = refuse(r, "it failed cut short (smaller than at assembly): what it held past the cut is gone, and a re-add would trust it outside the regions written since")
	case sb.States[r] == roleRebuilding && sb.ReAdd == nil:
		// A spare of a full rebuild is whole only below its position, which no bit covers. A
		// member that failed during its own re-add (its record says so) is taken: the role
		// was never active since it first left, so no bit was cleared, and the bits cover
		// what it missed then and since; its new map is taken from them.
		err = refuse(r, "it was being rebuilt into role %d when it left (its data is whole only below %d)", r, sb.Recovery)
	case a.eventsCleared == 0:
		err = refuse(r, "the superblocks do not record when the bitmap was last cleared (an array last run by an older raid5d)")
	case sb.Events < a.eventsCleared:
		err = refuse(r, "%w: its events counter %d is older than the bitmap's last clear at %d, so regions it missed may no longer be marked", ErrStaleMember, sb.Events, a.eventsCleared)
	case sb.Events > a.events:
		err = refuse(r, "its events counter %d is ahead of the array's %d", sb.Events, a.events)
	}
	if err != nil {
		a.sbMu.Unlock()
		return err
	}
	var ref *superblock
	for _, x := range a.all() {
		if !x.faulty.Load() {
			ref = x.sb
			break
		}
	}
	nsb := *ref
	nsb.DeviceUUID, nsb.Role = sb.DeviceUUID, r
	nm := newMember(m, &nsb)
	nm.rebuilding.Store(true)
	nm.readd.Store(true)
	if old != nil {
		a.roles.remove(old)
		drop := func(x *member) bool { return x == old }
		a.faulty, a.retired = slices.DeleteFunc(a.faulty, drop), slices.DeleteFunc(a.retired, drop)
		if old.Member != m {
			a.retired = append(a.retired, old)
		}
	}
	if x := a.roles.member(r); x != nil { // a faulty member of the role, not m: kept listed
		a.faulty = append(a.faulty, x)
	}
	rm := newReaddMap(stripes, a.bm.RegionStripes(), a.syncBatch(), a.bm.IsSet)
	pos := stripes
	if p := rm.next(0); p >= 0 {
		pos = p * rm.piece
	}
	a.roles.setReAdd(rm, pos)
	a.roles.set(r, nm)
	a.bm.Hold(nil) // its bitmap is written whole at the next flush
	a.roles.recount()
	err = a.writeSuperblocks(nil)
	if err == nil {
		rm.active.Store(true)
	}
	cleared := a.eventsCleared
	a.sbMu.Unlock()
	a.locks.UnlockSpan(0, stripes)
	locked = false
	a.log.Info("raid: member re-added; resyncing the regions written while it was away", "member", m.Name(),
		"role", r, "events", sb.Events, "bitmap_cleared_at", cleared, "regions", a.bm.Status().Set)
	if err == nil {
		err = checkConns(nm, nsb.ArrayUUID, nsb.DeviceUUID, r, "re-add")
	}
	if err != nil {
		return err
	}
	a.maybeRebuild()
	return nil
}

// readdWindow is how many pieces a re-add resyncs at once, each a round trip to read the
// survivors and one to write the member, which a remote member makes the whole cost: the
// regions of a re-add lie far apart (1% of them: one every 100 regions). Each piece is
// resynced under its own stripes' locks only, so client I/O waits for the pieces it meets,
// not for the others (TestReAddLocksPieces).
const readdWindow = 8

// readdResync resyncs onto sp, for role, the pieces the re-add's map wants, from the rebuild
// position on, up to readdWindow at once (readdPiece): the pieces writes wait for first
// (awaitReAdd), at once, then the others in order (readdMap.pick), each after the speed
// limit's wait for the one before. It
// returns when every piece is resynced, at the first error, or when ctx is done; then the
// writes waiting go ahead (the map's ended).
func (a *Array) readdResync(ctx context.Context, j *syncJob, sp *member, role int, t *throttle) error {
	m := a.roles.readd.Load()
	if m == nil {
		return fmt.Errorf("raid: the re-add of role %d has no map", role)
	}
	C := a.layout.ChunkSize()
	bufs := make(chan [][]byte, readdWindow)
	for range readdWindow {
		b := make([][]byte, a.layout.Members())
		for i := range b {
			b[i] = aligned.Make(int(m.piece * C)) // members read into it: aligned for direct I/O
		}
		bufs <- b
	}
	var first error
	var owed int64 // the bytes of the last throttled piece started, which the next one waits for
	var wg sync.WaitGroup
	m.mu.Lock()
	m.ended = false
	defer func() {
		m.mu.Lock()
		m.ended = true
		m.notify()
		m.mu.Unlock()
	}()
	for first == nil {
		p := m.pick(a.roles.rebuildPos())
		if p == -1 {
			break
		}
		if p == -2 {
			ch := m.changed
			m.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
			}
			m.mu.Lock()
			if ctx.Err() != nil && first == nil {
				first = ctx.Err()
			}
			continue
		}
		m.inflight[p] = true
		var n int64
		m.staleRuns(p, func(_, k int64) error { n += k; return nil })
		// A piece a write waits for goes at once: the speed limit keeps the resync from
		// slowing the clients, not from serving them. The pieces after it pay for it.
		urgent := m.want[p]
		m.mu.Unlock()
		var err error
		if urgent {
			t.done += n * C
		} else {
			// Throttled for the piece before it, as a rebuild waits after each batch: the
			// first piece starts at once.
			err = t.wait(ctx, owed)
			owed = n * C
		}
		m.mu.Lock()
		if err != nil {
			delete(m.inflight, p)
			first = err
			break
		}
		wg.Go(func() {
			b := <-bufs
			moved, err := a.readdPiece(sp, role, m, p, b)
			bufs <- b
			a.syncMu.Lock()
			j.p.Resynced += moved * C
			a.syncMu.Unlock()
			m.mu.Lock()
			delete(m.inflight, p)
			if err != nil && first == nil {
				first = err
			}
			m.notify()
			m.mu.Unlock()
		})
		m.mu.Unlock()
		a.setDone(j, t, a.roles.rebuildPos()*C)
		m.mu.Lock()
	}
	m.mu.Unlock()
	wg.Wait()
	a.setDone(j, t, a.roles.rebuildPos()*C)
	return first
}

// awaitReAdd waits, before a write of [off, off+n), until the re-added member is whole in
// every stripe it touches, asking the re-add to resync those pieces first: no write may leave
// the member out of a stripe (a degraded write, which a crash can tear beyond repair) while
// the member is there to be written. It returns at once without a re-add under way, when the
// re-add stops, and after the member timeout (then the write goes on without the member, as
// in any degraded array; logged).
func (a *Array) awaitReAdd(off, n int64) {
	m := a.roles.readd.Load()
	if m == nil || n <= 0 {
		return
	}
	ss := a.layout.StripeSize()
	s0, s1 := off/ss, (off+n+ss-1)/ss
	var timer *time.Timer
	for {
		m.mu.Lock()
		if m.ended || !m.active.Load() || a.roles.readd.Load() != m {
			m.mu.Unlock()
			return
		}
		pos, missing, added := a.roles.rebuildPos(), false, false
		for p := max(s0, pos) / m.piece; p*m.piece < s1; p++ {
			if !m.whole(p, pos) {
				missing = true
				added = added || !m.want[p]
				m.want[p] = true
			}
		}
		if !missing {
			m.mu.Unlock()
			return
		}
		if added {
			// Only news wakes the re-add: two writes waiting, each waking the other at
			// every turn, would spin.
			m.notify()
		}
		ch := m.changed
		m.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(a.timeout)
			defer timer.Stop()
		}
		select {
		case <-ch:
		case <-timer.C:
			a.log.Warn("raid: a write waited the member timeout for the re-add to resync its stripes; writing it without the re-added member",
				"offset", off, "length", n, "timeout", a.timeout)
			return
		}
	}
}

// readdPending reports whether a write of [off, off+n) would have to wait for the re-add
// (awaitReAdd): the fast paths that cannot wait (WriteCached, PlaceWrite) leave such a write
// to WriteAt.
func (a *Array) readdPending(off, n int64) bool {
	m := a.roles.readd.Load()
	if m == nil || n <= 0 {
		return false
	}
	ss := a.layout.StripeSize()
	for s := off / ss; s < (off+n+ss-1)/ss; s++ {
		if !a.roles.isRebuilt(s) {
			return true
		}
	}
	return false
}

// readdPiece resyncs onto sp the stripes of piece p that lie in units the map wants, under
// the piece's stripes' locks: rebuildSpan writes out their dirty heads first, and every
// write that left the member out of them has set its region's bit, and the re-add's map
// marked its unit, before the re-add began. Then, still under the locks, it syncs the member,
// marks the piece resynced in the map (the member serves it from then on) and writes the
// map into the superblocks, so the member is never served where a restart after a crash
// would not know it whole. It returns the stripes resynced.
func (a *Array) readdPiece(sp *member, role int, m *readdMap, p int64, bufs [][]byte) (int64, error) {
	s0 := p * m.piece
	n := min(m.piece, m.stripes-s0)
	a.locks.LockSpan(s0, n)
	defer a.locks.UnlockSpan(s0, n)
	// The piece's runs at once, each into its own part of bufs: each is a round trip to
	// the survivors and one to the member.
	C := a.layout.ChunkSize()
	var moved int64
	var runs [][2]int64
	m.staleRuns(p, func(s, k int64) error {
		moved += k
		runs = append(runs, [2]int64{s, k})
		return nil
	})
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, run := range runs {
		sub := make([][]byte, len(bufs))
		for j := range bufs {
			sub[j] = bufs[j][(run[0]-s0)*C:]
		}
		wg.Go(func() { errs[i] = a.rebuildSpan(sp, role, run[0], run[1], sub) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	// Under the piece's locks: bounded (syncSpare).
	if err := a.syncSpare(sp, role); err != nil {
		return 0, err
	}
	m.mu.Lock()
	pos := m.resynced(p, a.roles.rebuildPos())
	a.roles.rebuilt.Store(pos)
	m.prune(pos)
	gen := m.gen
	m.mu.Unlock()
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	m.mu.Lock()
	carried := m.durable >= gen // another piece's update, written after this one's mark
	m.mu.Unlock()
	if carried {
		return moved, nil
	}
	return moved, a.writeSuperblocks(nil)
}
