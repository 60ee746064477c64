package raid

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// findMember returns the member named by name: a path (Member.Name; a faulty: spec matches by
// its path) or a role number. The caller holds sbMu.
func (a *Array) findMember(name string) (*member, error) {
	if spec, ok := strings.CutPrefix(name, FaultySpecPrefix); ok {
		name, _, _ = strings.Cut(spec, "?")
	}
	if r, err := strconv.Atoi(name); err == nil {
		if r >= 0 && r < len(a.roles) {
			if m := a.roles[r].Load(); m != nil {
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

// Fail marks a member faulty, as a failing write would (like mdadm --fail): member is a path or
// a role number. The other superblocks record it before Fail returns; the array continues
// degraded and a rebuild onto a spare starts if there is one. Failing a spare takes it out of
// the spares. Failing a second role's member fails the array, as losing the disk would.
func (a *Array) Fail(member string) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if err := a.writable(); err != nil && !errors.Is(err, ErrArrayFailed) {
		return err
	}
	a.sbMu.Lock()
	m, err := a.findMember(member)
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
	a.fail(m, errors.New("failed by request"))
	return nil
}

// Remove drops a faulty member or a spare from the array (like mdadm --remove); name is a path or a role number. It is no
// longer listed, and its superblock is left as it was. ErrNotFaulty for a working member.
func (a *Array) Remove(name string) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return ErrClosed
	}
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	m, err := a.findMember(name)
	if err != nil {
		return err
	}
	if !m.faulty.Load() && m.sb.Role >= 0 {
		return fmt.Errorf("%w: %s holds role %d", ErrNotFaulty, m.Name(), m.sb.Role)
	}
	for r := range a.roles {
		if a.roles[r].Load() == m {
			a.roles[r].Store(nil)
		}
	}
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
	a.retired = append(a.retired, m)
	a.recount()
	if m.faulty.Load() {
		return nil
	}
	return a.writeSuperblocks(nil) // the spare is gone
}

// AddSpare opens path (an existing file or block device at least as large as the members'
// data end), writes a spare superblock on it (role -1, this array's UUID) and adds it as a
// spare. If a role has no working member a rebuild onto it starts at once. The path must not
// already be a member, under this name or another (a second path, a hard link, a spec of it),
// nor the array's journal: ErrDuplicateMember and ErrJournalOnMember, with nothing written.
func (a *Array) AddSpare(path string) error {
	if err := a.checkNewMember(path); err != nil {
		return err
	}
	m, err := OpenMember(path, false)
	if err != nil {
		return &MemberError{Member: path, Role: -1, Op: "open", Off: -1, Err: err}
	}
	if err := a.AddSpareMember(m); err != nil {
		m.Close()
		return err
	}
	return nil
}

// checkNewMember refuses a path for a new spare that is the same file as one of the array's
// members (active, faulty, spare or retired), whatever it is called, or that shares storage
// with the journal (checkJournalPlacement).
func (a *Array) checkNewMember(path string) error {
	a.sbMu.Lock()
	var names []string
	for _, x := range append(a.all(), a.retired...) {
		names = append(names, x.Name())
	}
	a.sbMu.Unlock()
	if err := checkDistinct(append(names, path)); err != nil {
		return err
	}
	if a.jr != nil {
		if err := checkJournalPlacement(a.jr.path, []string{path}); err != nil {
			return err
		}
	}
	return nil
}

// AddSpareMember is AddSpare on a member already open. On success the array owns m.
func (a *Array) AddSpareMember(m Member) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return ErrClosed
	}
	if a.readOnly {
		return ErrReadOnly
	}
	if m.Size() < a.dataOffset+a.memberData {
		return &MemberError{Member: m.Name(), Role: -1, Op: "add", Off: -1,
			Err: fmt.Errorf("%w: %d bytes, the array needs %d on each member", ErrMemberTooSmall, m.Size(), a.dataOffset+a.memberData)}
	}
	a.sbMu.Lock()
	for _, x := range append(a.all(), a.retired...) {
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
	sp := &member{Member: m, sb: &sb}
	a.spares = append(a.spares, sp)
	err := a.writeSuperblocks(nil)
	a.sbMu.Unlock()
	a.log.Info("raid: spare added", "member", m.Name())
	if err != nil {
		return err
	}
	a.maybeRebuild()
	return nil
}

// Replace adds path as a spare and rebuilds member's role onto it. This is the simple version:
// member is failed first (as Fail), so the array runs degraded until the rebuild ends, rather
// than member serving until its replacement is complete. ErrBusy while a rebuild runs.
func (a *Array) Replace(member, path string) error {
	a.sbMu.Lock()
	m, err := a.findMember(member)
	role := -1
	if err == nil {
		role = m.sb.Role
	}
	a.sbMu.Unlock()
	if err != nil {
		return err
	}
	if m.faulty.Load() || role < 0 {
		return fmt.Errorf("%w: %s is not an active member", ErrNoSuchMember, member)
	}
	a.syncMu.Lock()
	busy := a.job != nil && a.job.running && a.job.kind == "rebuild"
	a.syncMu.Unlock()
	if busy {
		return ErrBusy
	}
	if a.Status().State == StateDegraded {
		return ErrDegraded // replacing a member now would fail the array
	}
	a.stopSync(false)
	if err := a.AddSpare(path); err != nil {
		return err
	}
	return a.Fail(member)
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
