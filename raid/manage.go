package raid

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	memberpkg "github.com/raid5d/raid5d/raid/member"
)

// findMember returns the member named by name: a path (Member.Name; a spec of a kind with a
// local file, such as faulty:PATH?..., matches by its PATH: specName) or a role number. The
// caller holds sbMu.
func (a *Array) findMember(name string) (*member, error) {
	name = specName(name)
	if r, err := strconv.Atoi(name); err == nil {
		if r >= 0 && r < a.roles.n() {
			if m := a.roles.member(r); m != nil {
				return m, nil
			}
		}
		return nil, fmt.Errorf("%w: role %s has none", ErrNoSuchMember, name)
	}
	for _, m := range a.all() {
		if m.Name() == name {
			return m, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNoSuchMember, name)
}

// ManageOption changes what a management method (Fail, AddSpare, AddSpareMember, Replace)
// allows.
type ManageOption int

const (
	// Force is mdadm's --force: Fail and Replace fail the member even if that leaves the array
	// failed (ErrWouldFail without it), and AddSpare and Replace overwrite a path that carries
	// another array's raid5d superblock or journal (ErrInUse without it).
	Force ManageOption = iota + 1
)

func forced(opts []ManageOption) bool { return slices.Contains(opts, Force) }

// Fail marks a member faulty, as a failing write would (like mdadm --fail): member is a path or
// a role number. The other superblocks record it before Fail returns; the array continues
// degraded and a rebuild onto a spare starts if there is one. Failing a spare takes it out of
// the spares; failing a faulty member does nothing. A member whose loss would fail the array
// (roleTable.lost: a second role without a working member, counting a role whose rebuild has not
// finished) is refused with ErrWouldFail, unless opts has Force.
func (a *Array) Fail(member string, opts ...ManageOption) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if err := a.writable(); err != nil && !errors.Is(err, ErrArrayFailed) {
		return err
	}
	a.mgmtMu.Lock()
	defer a.mgmtMu.Unlock()
	if !a.lockSuperblocks() {
		// A superblock update is held up, most likely by the very member to fail (it hangs:
		// the update waits for it until the member timeout). A member in a role is found
		// without sbMu (roles are atomic) and failed at once, which lets that update go on
		// without it; anything else waits for the lock.
		if m := a.roles.named(specName(member)); m != nil {
			loss := a.roles.checkLoss(m, "failing "+member)
			if loss != nil && !forced(opts) {
				return loss
			}
			m.byRequest.Store(true)
			a.fail(m, failWhy(loss))
			return nil
		}
		a.sbMu.Lock()
	}
	m, err := a.findMember(member)
	var loss error
	if err == nil {
		loss = a.roles.checkLoss(m, "failing "+member)
		if !forced(opts) {
			err = loss
		}
	}
	if err == nil {
		for i, sp := range a.spares {
			if sp == m {
				a.spares = append(a.spares[:i:i], a.spares[i+1:]...)
				a.faulty = append(a.faulty, m)
			}
		}
	}
	a.sbMu.Unlock()
	if err != nil {
		return err
	}
	m.byRequest.Store(true)
	a.fail(m, failWhy(loss))
	return nil
}

// failWhy is what the log says a member failed by request failed of; loss is roleTable.checkLoss's
// refusal that Force overrode, if any.
func failWhy(loss error) error {
	if loss != nil {
		return fmt.Errorf("failed by request, with force: %w", loss)
	}
	return errors.New("failed by request")
}

// lockSuperblocks takes sbMu if it can within statusWait, and reports whether it did.
func (a *Array) lockSuperblocks() bool {
	for deadline := time.Now().Add(statusWait); !a.sbMu.TryLock(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// Remove drops a faulty member or a spare from the array (like mdadm --remove); name is a path
// or a role number. It is no longer listed, its superblock is left as it was, and it may be
// added again (AddSpare). ErrNotFaulty for a working member, so Remove never takes away
// redundancy: Fail first.
func (a *Array) Remove(name string) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return ErrClosed
	}
	a.mgmtMu.Lock()
	defer a.mgmtMu.Unlock()
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	m, err := a.findMember(name)
	if err != nil {
		return err
	}
	if !m.faulty.Load() && m.sb.Role >= 0 {
		return fmt.Errorf("%w: %s holds role %d", ErrNotFaulty, m.Name(), m.sb.Role)
	}
	a.roles.remove(m)
	drop := func(ms []*member) []*member {
		kept := ms[:0]
		for _, x := range ms {
			if x != m {
				kept = append(kept, x)
			}
		}
		return kept
	}
	a.spares, a.faulty = drop(a.spares), drop(a.faulty)
	// Kept open until Close: I/O begun before it failed may still be using it.
	a.retired = append(a.retired, m)
	a.roles.recount()
	if m.faulty.Load() {
		return nil
	}
	return a.writeSuperblocks(nil) // the spare is gone
}

// AddSpare opens path (an existing file or block device at least as large as the members'
// data end), writes a spare superblock on it (role -1, this array's UUID) and adds it as a
// spare. If a role has no working member a rebuild onto it starts at once. The path must not
// already be a member, under this name or another (a second path, a hard link, a spec of it),
// nor the array's journal: ErrDuplicateMember and ErrJournalOnMember, with nothing written. A
// member removed earlier (Remove) may be added again. A path that carries another array's
// superblock or journal is refused with ErrInUse (as Create refuses it), unless opts has Force.
func (a *Array) AddSpare(path string, opts ...ManageOption) error {
	end, err := a.beginManage()
	if err != nil {
		return err
	}
	defer end()
	return a.addSpare(path, forced(opts), false)
}

// beginManage takes opMu (read), checks manageable and takes mgmtMu, for a call that adds a
// member. It returns the function that releases both, or manageable's error with neither held.
func (a *Array) beginManage() (end func(), err error) {
	a.opMu.RLock()
	if err := a.manageable(); err != nil {
		a.opMu.RUnlock()
		return nil, err
	}
	a.mgmtMu.Lock()
	return func() {
		a.mgmtMu.Unlock()
		a.opMu.RUnlock()
	}, nil
}

// manageable returns why the array cannot take a new member now (closed, read-only), or nil.
// The caller holds opMu.
func (a *Array) manageable() error {
	switch {
	case a.closed:
		return ErrClosed
	case a.readOnly:
		return ErrReadOnly
	}
	return nil
}

// addSpare is AddSpare (first: at the head of the spares, so the next rebuild takes it) with
// opMu and mgmtMu held. A removed member's file added again under the same plain path reuses
// the open file it still has (see Remove; a second open would meet its lock), without the
// faulty: or volatile: wrapper it may have had.
func (a *Array) addSpare(path string, force, first bool) error {
	if err := a.checkNewMember(path); err != nil {
		return err
	}
	a.sbMu.Lock()
	var old *member
	var file *fileMember
	for _, x := range a.retired {
		if fm := baseFile(x.Member); fm != nil && fm.Name() == path {
			old, file = x, fm
		}
	}
	a.sbMu.Unlock()
	if old != nil {
		if n := old.abandoned.Load(); n > 0 {
			// It was failed hung: a superblock or bitmap write the array stopped waiting
			// for may still land, over what the new spare's superblock would say. (A data
			// write still under way holds its stripe's lock, which the rebuild waits for.)
			return fmt.Errorf("%w: %s still has %d writes under way from before it failed; add it when they have finished", ErrMemberBusy, path, n)
		}
		if err := a.addSpareMember(file, force, first); err != nil {
			return err
		}
		a.sbMu.Lock()
		a.retired = slices.DeleteFunc(a.retired, func(x *member) bool { return x == old })
		a.sbMu.Unlock()
		return nil
	}
	m, err := a.openNew(path)
	if err != nil {
		return &MemberError{Member: path, Role: -1, Op: "open", Off: -1, Err: err}
	}
	if err := a.addSpareMember(m, force, first); err != nil {
		m.Close()
		return err
	}
	return nil
}

// baseFile returns the member file under m's wrappers (faulty: and volatile:), nil if there is
// none (an in-memory member).
func baseFile(m Member) *fileMember {
	fm, _ := memberpkg.Base(m).(*fileMember)
	return fm
}

// specName is the name of the member a spec opens, as Member.Name has it: its local file if
// its kind has one (a faulty: spec's PATH), else the spec (a plain path, a remote member's URI).
func specName(spec string) string {
	if p := SpecPath(spec); p != "" {
		return p
	}
	return spec
}

// checkNewMember refuses a path for a new spare that is the same file as one of the array's
// members (active, faulty or spare), whatever it is called, or that shares storage with the
// journal (checkJournalPlacement). Removed members are no longer the array's.
func (a *Array) checkNewMember(path string) error {
	a.sbMu.Lock()
	var names []string
	for _, x := range a.all() {
		names = append(names, x.Name())
	}
	a.sbMu.Unlock()
	if err := checkDistinct(append(names, path)); err != nil {
		return err
	}
	if a.jr != nil {
		if err := checkJournalPlacement(a.jr.Path(), []string{path}); err != nil {
			return err
		}
	}
	return nil
}

// AddSpareMember is AddSpare on a member already open. On success the array owns m.
func (a *Array) AddSpareMember(m Member, opts ...ManageOption) error {
	end, err := a.beginManage()
	if err != nil {
		return err
	}
	defer end()
	return a.addSpareMember(m, forced(opts), false)
}

// addSpareMember is AddSpareMember with opMu and mgmtMu held; first puts m at the head of
// the spares, so that the next rebuild takes it.
func (a *Array) addSpareMember(m Member, force, first bool) error {
	if m.Size() < a.dataOffset+a.memberData {
		return &MemberError{Member: m.Name(), Role: -1, Op: "add", Off: -1,
			Err: fmt.Errorf("%w: %d bytes, the array needs %d on each member", ErrMemberTooSmall, m.Size(), a.dataOffset+a.memberData)}
	}
	if !force {
		if err := a.checkForeign(m); err != nil {
			return err
		}
	}
	a.sbMu.Lock()
	for _, x := range a.all() {
		if x.Name() == m.Name() {
			a.sbMu.Unlock()
			return &MemberError{Member: m.Name(), Role: -1, Op: "add", Off: -1, Err: ErrDuplicateMember}
		}
	}
	var ref *superblock
	for _, x := range a.all() {
		if !x.faulty.Load() {
			ref = x.sb
			break
		}
	}
	sb := *ref
	sb.DeviceUUID, sb.Role, sb.Dirty = newUUID(), spareRole, a.dirty.Load()
	sp := newMember(m, &sb)
	if first {
		a.spares = append([]*member{sp}, a.spares...)
	} else {
		a.spares = append(a.spares, sp)
	}
	err := a.writeSuperblocks(nil)
	a.sbMu.Unlock()
	a.log.Info("raid: spare added", "member", m.Name())
	if err == nil {
		err = checkConns(sp, sb.ArrayUUID, sb.DeviceUUID, spareRole, "add")
	}
	if err != nil {
		return err
	}
	a.maybeRebuild()
	return nil
}

// checkForeign refuses m, with ErrInUse, if it carries another array's raid5d superblock (the
// check Create makes) or is another array's write journal: making it a spare would destroy
// that array. This array's own superblock (a member removed earlier) is no obstacle.
func (a *Array) checkForeign(m Member) error {
	a.sbMu.Lock()
	own := a.uuid
	a.sbMu.Unlock()
	if sb, err := readSuperblock(m); err == nil && sb.ArrayUUID != own {
		return &MemberError{Member: m.Name(), Role: -1, Op: "add", Off: SuperblockOffset,
			Err: fmt.Errorf("%w: role %d of array %s (use Force to overwrite)", ErrInUse, sb.Role, sb.ArrayUUID)}
	}
	if owner, ok := journalOwner(m); ok && owner != own {
		return &MemberError{Member: m.Name(), Role: -1, Op: "add", Off: 0,
			Err: fmt.Errorf("%w: the journal of array %s (use Force to overwrite)", ErrInUse, owner)}
	}
	return nil
}

// Replace adds path as a spare and rebuilds member's role onto it; other spares stay spares.
// This is the simple version: member is failed first (as Fail), so the array runs degraded
// until the rebuild ends, rather than member serving until its replacement is complete.
// ErrBusy while a rebuild runs; ErrWouldFail if failing member would fail the array (it is
// degraded), and ErrInUse for a path with another array's superblock, unless opts has Force.
func (a *Array) Replace(member, path string, opts ...ManageOption) error {
	end, err := a.beginManage()
	if err != nil {
		return err
	}
	defer end()
	force := forced(opts)
	a.sbMu.Lock()
	m, err := a.findMember(member)
	if err == nil && (m.faulty.Load() || a.roles.roleOf(m) < 0) {
		err = fmt.Errorf("%w: %s is not an active member", ErrNoSuchMember, member)
	}
	if err == nil && !force {
		err = a.roles.checkLoss(m, "replacing "+member)
	}
	a.sbMu.Unlock()
	if err != nil {
		return err
	}
	a.syncMu.Lock()
	busy := a.job != nil && a.job.running && a.job.kind == "rebuild"
	a.syncMu.Unlock()
	if busy {
		return ErrBusy
	}
	a.stopSync(false)
	if err := a.addSpare(path, force, true); err != nil {
		return err
	}
	m.byRequest.Store(true)
	a.fail(m, fmt.Errorf("replaced by %s", path))
	return nil
}

// SetSyncSpeed sets the rebuild and scrub speed bounds in bytes/s (see
// IOOptions.SyncSpeedMin); 0 leaves one unchanged. It applies to a running sync at once.
func (a *Array) SetSyncSpeed(min, max int64) error {
	if min < 0 || max < 0 {
		return ErrBadSpeed
	}
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	lo, hi := a.speedMin, a.speedMax
	if min > 0 {
		lo = min
	}
	if max > 0 {
		hi = max
	}
	if lo > hi {
		return fmt.Errorf("%w: min %d > max %d", ErrBadSpeed, lo, hi)
	}
	a.speedMin, a.speedMax = lo, hi
	return nil
}

// maxManageWait bounds openNew's wait for a remote member: the management command that asked
// for it waits for the answer (control.ManageWait).
const maxManageWait = 30 * time.Second

// openNew opens path, a member being added (AddSpare, Replace, ReAdd), for exclusive use. A
// remote member that does not answer (a server not up yet, refusing, or silent) is tried
// again with assembly's backoff for the array's WaitRemote (AssembleOptions), at most
// maxManageWait, as Assemble tries it (openLate).
func (a *Array) openNew(path string) (Member, error) {
	wait := min(a.waitRemote, maxManageWait)
	if wait <= 0 || SpecPath(path) != "" {
		return OpenMember(path, false)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return openLate(ctx, path, useExclusive, wait, a.log, nil)
}
