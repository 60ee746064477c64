package raid

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// roleTable says which member serves each role, and answers what follows from that: which
// roles are usable, missing or lost in a stripe, and whether the array has failed. It owns the
// write gate that the failure shuts. Every I/O reads it, without a lock.
//
// Who changes what: set, remove and recount run under Array.sbMu (or in newArray, which owns
// the array alone); markFaulty runs without sbMu (fail marks a member before it takes sbMu, so
// that I/O goes around the member at once); the rebuild position moves past stripe s only
// while s's stripe lock is held or once a re-add's map serves s (serveRebuilt, readdMap). A
// member's own flags (faulty, rebuilding) are atomics of the member.
//
// The decision that the array has failed is made in one place, recount, which shuts the gate.
// failed only reports it; what must not happen on a failed array (a member write) is refused
// by the gate, not by a check of failed before the action.
type roleTable struct {
	// byRole holds, by role, the member serving it: active, rebuilding (usable below the
	// rebuild position) or faulty; nil if none. Stored by set and remove.
	byRole []atomic.Pointer[member]
	// bad counts the roles whose member is not active (none, faulty or rebuilding); 0 lets the
	// per-stripe questions answer without looking at each role. recount makes it exact and
	// markFaulty adds to it, so it never counts fewer roles than there are (see recount).
	bad atomic.Int32
	// rebuilt is the rebuild position in stripes: the rebuilding member serves the stripes
	// below it. It moves past stripe s only while s's lock is held, or (a re-add) once the
	// re-add's map serves s.
	rebuilt atomic.Int64
	// synced and recorded trail rebuilt during a full rebuild: the rebuilding member's chunks
	// below synced are durable on it, so a superblock update may record synced; the
	// superblocks on disk record recorded. A full rebuild moves rebuilt batch by batch and
	// lets the other two catch up each second (Array.recordRebuilt); a write to a stripe in
	// [recorded, rebuilt) makes them catch up first (unrecorded). Outside a full rebuild all
	// three are equal, and a re-add records its position piece by piece (readdPiece).
	synced, recorded atomic.Int64
	// readd is the re-added member's map (readdmap.go) while the rebuilding member is a
	// re-added one: it also serves the stripes at or above rebuilt that the map says it is
	// whole in. nil otherwise; setRebuilt drops it.
	readd atomic.Pointer[readdMap]
	// last is the array's last stripe, where a role being rebuilt stays lost longest.
	last int64
	// timeout is the member timeout (≤ 0: none): drain does not wait for a member whose
	// writes have hung for longer.
	timeout time.Duration
	// gate admits every member data write; recount shuts it when the array fails (gate.go).
	gate writeGate
	// onFail runs each time recount finds the array failed (Array.releasePins, which acts
	// once); recount's caller may hold sbMu and a stripe lock.
	onFail func()
}

// init sizes t for roles roles in an array of stripes stripes (per member).
func (t *roleTable) init(roles int, stripes int64, timeout time.Duration) {
	t.byRole = make([]atomic.Pointer[member], roles)
	t.last = stripes - 1
	t.timeout = timeout
}

// n returns the number of roles.
func (t *roleTable) n() int { return len(t.byRole) }

// member returns the member serving role r in any state (active, rebuilding, faulty), or nil.
func (t *roleTable) member(r int) *member { return t.byRole[r].Load() }

// working returns role r's member unless it is faulty or there is none (nil): a rebuilding
// member is working, though it serves only the stripes below the rebuild position.
func (t *roleTable) working(r int) *member {
	if m := t.byRole[r].Load(); m != nil && !m.faulty.Load() {
		return m
	}
	return nil
}

// usable returns the member that serves role r in stripe s, or nil if none does.
func (t *roleTable) usable(r int, s int64) *member {
	m := t.byRole[r].Load()
	if m == nil || m.faulty.Load() || m.rebuilding.Load() && !t.isRebuilt(s) {
		return nil
	}
	return m
}

// isRebuilt reports whether the rebuilding member serves stripe s: below the rebuild position
// or, for a re-added member, where its map says it is whole. The map is read first: the
// re-add moves the position before it drops a piece from the map (readdMap.prune), so a
// stripe the map does not serve was below no position the map had passed.
func (t *roleTable) isRebuilt(s int64) bool {
	if m := t.readd.Load(); m != nil && m.serves(s) {
		return true
	}
	return s < t.rebuilt.Load()
}

// degraded reports whether some role has no active member (none, faulty or rebuilding).
func (t *roleTable) degraded() bool { return t.bad.Load() > 0 }

// missing returns the roles with no active member, in order; nil if none.
func (t *roleTable) missing() []int {
	var rs []int
	for r := range t.byRole {
		if m := t.byRole[r].Load(); m == nil || m.faulty.Load() || m.rebuilding.Load() {
			rs = append(rs, r)
		}
	}
	return rs
}

// missingAt returns the first role with no usable member in stripe s, or -1.
func (t *roleTable) missingAt(s int64) int {
	if t.bad.Load() == 0 {
		return -1
	}
	for r := range t.byRole {
		if t.usable(r, s) == nil {
			return r
		}
	}
	return -1
}

// lostAt returns how many roles have no usable member in stripe s.
func (t *roleTable) lostAt(s int64) int {
	if t.bad.Load() == 0 {
		return 0
	}
	n := 0
	for r := range t.byRole {
		if t.usable(r, s) == nil {
			n++
		}
	}
	return n
}

// lost returns how many roles would have no usable member in the array's last stripe if gone
// (nil for none) stopped working too. The last stripe is where most roles are lost: a
// rebuilding member serves only the stripes below the rebuild position, so until its rebuild
// ends its role counts as lost there. Two or more lost roles is a failed array (recount); Fail
// and Replace refuse to make one without Force. The caller holds sbMu, or accepts a snapshot.
func (t *roleTable) lost(gone *member) int {
	if gone == nil && t.bad.Load() == 0 {
		return 0
	}
	n := 0
	for r := range t.byRole {
		if m := t.usable(r, t.last); m == nil || m == gone {
			n++
		}
	}
	return n
}

// checkLoss returns an ErrWouldFail error, saying which roles would be lost, if losing m (what
// names the change) would leave the array failed when it is not, or more roles lost when it
// is (lost); nil otherwise. The caller holds sbMu, or accepts a snapshot (Fail of a member
// that holds sbMu up).
func (t *roleTable) checkLoss(m *member, what string) error {
	n := t.lost(m)
	if n < 2 || n == t.lost(nil) {
		return nil
	}
	var lost []string
	for r := range t.byRole {
		x := t.byRole[r].Load()
		switch {
		case x == m:
			lost = append(lost, fmt.Sprintf("role %d: %s", r, m.Name()))
		case t.usable(r, t.last) != nil:
		case x == nil:
			lost = append(lost, fmt.Sprintf("role %d: no member", r))
		case x.faulty.Load():
			lost = append(lost, fmt.Sprintf("role %d: %s is faulty", r, x.Name()))
		default:
			lost = append(lost, fmt.Sprintf("role %d: %s is being rebuilt, %.1f%% done", r, x.Name(),
				100*float64(t.rebuilt.Load())/float64(t.last+1)))
		}
	}
	return fmt.Errorf("%w: %s would leave %d of %d roles without a working member (%s); RAID-5 survives the loss of one",
		ErrWouldFail, what, n, len(t.byRole), strings.Join(lost, "; "))
}

// named returns the member serving the role named by number, or whose Name is name, or nil.
// Without sbMu: Fail finds a hung member so while a superblock update waits for it.
func (t *roleTable) named(name string) *member {
	r, err := strconv.Atoi(name)
	for i := range t.byRole {
		if m := t.byRole[i].Load(); m != nil && (err == nil && i == r || err != nil && m.Name() == name) {
			return m
		}
	}
	return nil
}

// roleOf returns the role m holds or is being rebuilt into, or -1 (spare, retired).
func (t *roleTable) roleOf(m *member) int {
	for r := range t.byRole {
		if t.byRole[r].Load() == m {
			return r
		}
	}
	return -1
}

// states returns the per-role state table the superblocks record (roleFaulty, roleRebuilding,
// else 0 for active) and whether a role is being rebuilt.
func (t *roleTable) states() (states [stripe.MaxMembers]uint8, rebuilding bool) {
	for r := range t.byRole {
		switch m := t.byRole[r].Load(); {
		case m == nil || m.faulty.Load():
			states[r] = roleFaulty
		case m.rebuilding.Load():
			states[r] = roleRebuilding
			rebuilding = true
		}
	}
	return states, rebuilding
}

// rebuildPos returns the rebuild position in stripes.
func (t *roleTable) rebuildPos() int64 { return t.rebuilt.Load() }

// setRebuilt sets the rebuild position to stripe s, served, synced and recorded alike, and
// drops a re-add's map: at assembly (before the array serves), at the rebuild's start (under
// sbMu, before the spare takes the role) and at its end (sbMu, the member synced).
func (t *roleTable) setRebuilt(s int64) {
	t.rebuilt.Store(s)
	t.synced.Store(s)
	t.recorded.Store(s)
	t.readd.Store(nil)
}

// serveRebuilt moves the served rebuild position of a full rebuild to stripe s, ahead of the
// synced and recorded ones. The caller holds the locks of the stripes it passes.
func (t *roleTable) serveRebuilt(s int64) { t.rebuilt.Store(s) }

// unrecorded reports whether stripes [s0, s0+n) reach into a full rebuild's unrecorded window
// [recorded, rebuilt): there the rebuilding member is served as whole while the superblocks
// still say it is not, and a restart after a crash would rebuild its chunks from the others.
// A write must not reach a member there before the position is recorded (Array.recordBefore):
// torn by a crash, it would make the restart rebuild the member's chunks, flushed ones too,
// from the torn stripe. The caller holds the stripes' locks (so rebuilt does not move past
// them); recorded only grows meanwhile. One atomic load when no window is open below s0+n.
func (t *roleTable) unrecorded(s0, n int64) bool {
	if s0+n <= t.recorded.Load() {
		return false
	}
	return s0 < t.rebuilt.Load() && t.readd.Load() == nil
}

// setReAdd makes m the re-added member's map, its position at stripe pos (under sbMu, with
// every stripe's lock held or before the array serves).
func (t *roleTable) setReAdd(m *readdMap, pos int64) {
	t.rebuilt.Store(pos)
	t.synced.Store(pos)
	t.recorded.Store(pos)
	t.readd.Store(m)
}

// set makes m (nil: none) serve role r. The caller holds sbMu and calls recount after.
func (t *roleTable) set(r int, m *member) { t.byRole[r].Store(m) }

// remove takes m out of any role it holds. The caller holds sbMu and calls recount after.
func (t *roleTable) remove(m *member) {
	for r := range t.byRole {
		if t.byRole[r].Load() == m {
			t.byRole[r].Store(nil)
		}
	}
}

// markFaulty marks m faulty and reports whether it already was. Without sbMu: from now on
// I/O goes around m; the caller records the failure and then calls recount under sbMu.
func (t *roleTable) markFaulty(m *member) (already bool) {
	if m.faulty.Swap(true) {
		return true
	}
	t.bad.Add(1) // counted at once, before recount: see bad
	return false
}

// recount recomputes bad after a change of membership, and decides whether the array has
// failed: two or more roles with no usable member in the last stripe (lost: a role being
// rebuilt is lost above the rebuild position, so a second failure then fails the array). That
// decision is made here only: it shuts the write gate for good (and runs onFail), and failed
// reports it from then on. recount returns failed. The caller holds sbMu (or owns the array
// alone).
//
// bad is stored by compare-and-swap, so that a markFaulty that lands between the count and the
// store (it runs without sbMu) is not overwritten: bad may then count one role too many until
// that failure's own recount, never one too few (which would let missingAt and lostAt answer
// "none" for a role already faulty).
func (t *roleTable) recount() bool {
	for {
		old := t.bad.Load()
		n := int32(0)
		for r := range t.byRole {
			if m := t.byRole[r].Load(); m == nil || m.faulty.Load() || m.rebuilding.Load() {
				n++
			}
		}
		if t.bad.CompareAndSwap(old, n) {
			break
		}
	}
	if t.lost(nil) > 1 {
		t.gate.close()
		if t.onFail != nil {
			t.onFail()
		}
	}
	return t.gate.closed()
}

// failed reports whether the array has failed (decided by recount; once true it stays true).
// It is a report, not a guard: what must not happen on a failed array goes through the gate.
func (t *roleTable) failed() bool { return t.gate.closed() }

// enter admits a write of role r's member through the gate, or reports false once the array
// has failed. Every true must be followed by leave(r) as soon as the write's system call returns.
func (t *roleTable) enter(r int) bool { return t.gate.enter(r) }

// leave ends a member write that enter admitted.
func (t *roleTable) leave(r int) { t.gate.leave(r) }

// drain waits, once the array has failed, until no member write admitted before the failure
// is still under way on a member that works (gate.drain). Every path that reports
// ErrArrayFailed for a write waits here first (fail, awaitRecord), so that when a client learns
// of the failure, the survivors hold what they will hold from then on. A member whose writes
// have hung past the member timeout is not waited for: the watchdog that would fail it may be
// the very caller waiting here.
func (t *roleTable) drain() {
	if !t.gate.closed() {
		return
	}
	t.gate.drain(len(t.byRole), func(r int) bool {
		m := t.byRole[r].Load()
		return m != nil && !m.faulty.Load() && (t.timeout <= 0 || m.look(time.Now()) <= t.timeout)
	})
}
