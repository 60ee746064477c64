package raid

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

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
	m, err := OpenMember(name, false)
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
	case sb.States[r] == roleRebuilding:
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
	a.roles.setRebuilt(0)
	a.roles.set(r, nm)
	a.bm.Hold(nil) // its bitmap is written whole at the next flush
	a.roles.recount()
	err = a.writeSuperblocks(nil)
	cleared := a.eventsCleared
	a.sbMu.Unlock()
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

// readdRuns calls fn for each run of stripes in [s0, s0+k) whose write-intent regions are
// set, in order, and returns the first error.
func (a *Array) readdRuns(s0, k int64, fn func(s, n int64) error) error {
	rs := a.bm.RegionStripes()
	for s := s0; s < s0+k; {
		end := min((s/rs+1)*rs, s0+k)
		if !a.bm.IsSet(s / rs) {
			s = end
			continue
		}
		run := s
		for s = end; s < s0+k && a.bm.IsSet(s/rs); s = min((s/rs+1)*rs, s0+k) {
		}
		if err := fn(run, s-run); err != nil {
			return err
		}
	}
	return nil
}

// A re-add works through a window of stripes from its position to the end of the
// readdWindow-th piece of the bitmap's regions to resync (at most a batch each), and at most
// readdMaxBatches batches (readdSpan), and resyncs those pieces concurrently (readdWindow):
// each is a round trip to read the survivors and one to write the member, which a remote
// member makes the whole cost, and the regions of a re-add lie far apart (1% of them: one
// every 100 regions). Each piece is resynced under its own stripes' locks only, so client I/O
// waits for the pieces it meets, not for the window (whose span, at 1024 stripes or more
// (stripe.NumLocks), would hold every stripe's lock).
const (
	readdWindow     = 8
	readdMaxBatches = 256
)

// readdSpan returns how many stripes from s0, at most limit and at least min(batch, limit), a
// re-add's window takes: up to the end of the readdWindow-th piece of regions whose bits are
// set now (read without the locks: readdWindow reads them again under them).
func (a *Array) readdSpan(s0, limit, batch int64) int64 {
	pieces, end := 0, int64(0)
	a.readdRuns(s0, limit, func(s, n int64) error {
		for ; n > 0 && pieces < readdWindow; s, n = s+batch, n-batch {
			pieces++
			end = s + min(n, batch) - s0
		}
		if pieces == readdWindow {
			return errStop
		}
		return nil
	})
	if pieces < readdWindow {
		return limit // nothing more to resync up to limit: take it all
	}
	return max(end, min(batch, limit))
}

// errStop stops readdRuns early (readdSpan).
var errStop = errors.New("stop")

// readdWindow resyncs onto sp, for role, the stripes of [s0, s0+k) whose write-intent bits
// are set, and marks every stripe of the window rebuilt ahead of the rebuild position
// (roleTable.setAhead) as it goes, so the caller can move the position past the window
// without its locks. The window is cut in pieces of at most a batch: the runs of regions set
// now, which up to readdWindow goroutines resync at once into buffers of extra (grown as
// needed, each like bufs, and returned), and the clean stretches between them, which the
// caller checks meanwhile (into bufs, should a region have been written since), each piece
// under its own stripes' locks (readdPiece). The clean pieces are not the goroutines': a
// clean piece 1024 stripes from one being resynced shares its locks and waits for it, and
// with them in the same queue every goroutine ended up waiting so, the resyncs one after
// another. It returns the stripes resynced, and the errors of the pieces that failed.
func (a *Array) readdWindow(sp *member, role int, s0, k, batch int64, bufs [][]byte, extra [][][]byte) (int64, [][][]byte, error) {
	var set, clean [][2]int64
	cut := func(to *[][2]int64, s, n int64) {
		for ; n > 0; s, n = s+batch, n-batch {
			*to = append(*to, [2]int64{s, min(n, batch)})
		}
	}
	at := s0
	a.readdRuns(s0, k, func(s, n int64) error {
		cut(&clean, at, s-at)
		cut(&set, s, n)
		at = s + n
		return nil
	})
	cut(&clean, at, s0+k-at)
	workers := min(len(set), readdWindow)
	for len(extra) < workers {
		b := make([][]byte, len(bufs))
		for i := range b {
			b[i] = aligned.Make(len(bufs[i])) // members read into it: aligned for direct I/O
		}
		extra = append(extra, b)
	}
	ahead := newStripeSet(s0, k)
	a.roles.setAhead(ahead)
	errs := make([]error, workers+1)
	var next, moved atomic.Int64
	var failed atomic.Bool
	do := func(pc [2]int64, b [][]byte) error {
		n, err := a.readdPiece(sp, role, pc[0], pc[1], b, ahead)
		moved.Add(n)
		if err != nil {
			failed.Store(true)
		}
		return err
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for !failed.Load() {
				i := next.Add(1) - 1
				if i >= int64(len(set)) {
					return
				}
				if errs[w] = do(set[i], extra[w]); errs[w] != nil {
					return
				}
			}
		})
	}
	for _, pc := range clean {
		if failed.Load() {
			break
		}
		if errs[workers] = do(pc, bufs); errs[workers] != nil {
			break
		}
	}
	wg.Wait()
	return moved.Load(), extra, errors.Join(errs...)
}

// readdPiece resyncs onto sp the stripes of [s, s+n) (n at most a batch, the length of each of
// bufs) whose write-intent bits are set, under their stripe locks, after their dirty heads are
// written out: every write to them has then set its region's bit, and no bit is cleared while
// the role is being rebuilt (bitmap.Members.Whole), so a clear bit is a region unchanged since
// the member left. Then, still under the locks, it adds them to ahead: from then on writes to
// them write the member too. It returns the stripes resynced.
func (a *Array) readdPiece(sp *member, role int, s, n int64, bufs [][]byte, ahead *stripeSet) (int64, error) {
	a.locks.LockSpan(s, n)
	defer a.locks.UnlockSpan(s, n)
	if err := a.writeOutSpan(s, n); err != nil {
		return 0, err
	}
	var moved int64
	err := a.readdRuns(s, n, func(rs, rn int64) error {
		moved += rn
		return a.rebuildSpan(sp, role, rs, rn, bufs)
	})
	if err != nil {
		return 0, err
	}
	ahead.add(s, n)
	return moved, nil
}
