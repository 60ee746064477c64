package raid

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	journalpkg "github.com/raid5d/raid5d/raid/internal/journal"
	memberpkg "github.com/raid5d/raid5d/raid/member"
)

// Errors of the I/O phase. Each carries the NBD errno the server should reply with
// (Errno() uint32); find it with errors.As through any wrapping.
var (
	// ErrOutOfRange is returned by ReadAt, WriteAt, WriteAtFUA, Trim and WriteZeroes for a
	// negative offset or length, or a range that ends past Size. Requests are never clamped.
	ErrOutOfRange error = &ioError{"raid: request beyond end of array", uint32(unix.EINVAL)}
	// ErrReadOnly is returned by the writing methods of an array assembled read-only.
	ErrReadOnly error = &ioError{"raid: array is read-only", uint32(unix.EPERM)}
	// ErrClosed is returned by every method of an array after Close.
	ErrClosed error = &ioError{"raid: array is closed", uint32(unix.ESHUTDOWN)}
	// ErrArrayFailed is returned (wrapped) by reads of data that cannot be rebuilt because two
	// roles have no working member, by every write to such an array, and by StartScrub and
	// Replace on it. Errno EIO.
	ErrArrayFailed error = &ioError{"raid: array failed (two members lost)", uint32(unix.EIO)}
	// ErrShortRead is the error, inside a *MemberError, of a member read that returned fewer
	// bytes than asked: a file truncated (or a block device shrunk) under the array, or a
	// Member that broke the ReadAt contract. A file member's ReadAt and ReadvAt return it at
	// the end of the file, saying how long the file now is, and the array turns any short
	// count (with io.EOF or none) into it (member.ErrShortRead is this error). It is a read error of the member like EIO — the bytes
	// are rebuilt from parity, and past IOOptions.ReadErrorLimit the member is marked faulty
	// — never zeroes. The array's I/O methods return it only inside an ErrArrayFailed error.
	// Errno EIO.
	ErrShortRead = memberpkg.ErrShortRead
	// ErrMemberShrunk is the error, inside a *MemberError, of a member file or block device
	// found smaller than when it was opened: every flush checks each member's size after its
	// fdatasync, and fails a member that shrank, even if no read has met its new end
	// (ErrShortRead). The array's I/O methods return it only inside an ErrArrayFailed error.
	// Errno EIO. It is member.ErrShrunk.
	ErrMemberShrunk = memberpkg.ErrShrunk
	// ErrMemberHung is the error a member is failed with when it stops answering: writes (data,
	// trims, syncs, the bitmap, superblocks) were under way on it and none completed within
	// IOOptions.MemberTimeout (the watchdog), or a superblock write or a sync of it did not complete
	// in that time. Wrapped in a *MemberError. A read slower than the timeout is only counted as
	// a read error (ErrTimeout), as md counts a read that times out in the disk driver: its data
	// is good and a rewrite is not needed; a write that does not complete is a member that no
	// longer holds what the array thinks it holds.
	ErrMemberHung error = &ioError{"raid: member stopped answering (no I/O completed within the member timeout)", uint32(unix.EIO)}
	// ErrTimeout is the error a member read that took longer than IOOptions.MemberTimeout is
	// counted and logged with (inside a *MemberError); the read's data is still used. Never returned
	// by the array's I/O methods.
	ErrTimeout error = &ioError{"raid: member read timed out", uint32(unix.EIO)}
)

// Errors of the management methods (Fail, Remove, AddSpare, Replace, StartScrub, StopScrub,
// SetSyncSpeed). Each carries an errno like the I/O errors.
var (
	// ErrBusy is returned by StartScrub while a rebuild or scrub runs, and by Replace while a
	// rebuild runs.
	ErrBusy error = &ioError{"raid: a rebuild or scrub is running", uint32(unix.EBUSY)}
	// ErrNoSuchMember is returned by Fail, Remove and Replace for a name that is neither a
	// member's path nor a role number with a member.
	ErrNoSuchMember error = &ioError{"raid: no such member", uint32(unix.ENOENT)}
	// ErrNotFaulty is returned by Remove for an active or rebuilding member (Fail it first).
	ErrNotFaulty error = &ioError{"raid: member is neither faulty nor a spare", uint32(unix.EBUSY)}
	// ErrDegraded is returned by StartScrub on a degraded array: parity cannot be checked
	// without every member; and by Replace on a degraded array (with ErrWouldFail).
	ErrDegraded error = &ioError{"raid: array is degraded", uint32(unix.EIO)}
	// ErrWouldFail is returned by Fail and Replace, without Force, for a member whose loss
	// would leave two or more roles without a working member, so that the array would fail.
	// A role being rebuilt counts as lost, since its member does not yet serve every stripe.
	ErrWouldFail error = &ioError{"raid: that would leave the array failed", uint32(unix.EBUSY)}
	// ErrNotRunning is returned by StopScrub when no scrub runs.
	ErrNotRunning error = &ioError{"raid: no scrub is running", uint32(unix.EINVAL)}
	// ErrCannotReAdd is returned by ReAdd and ReAddMember for a member the write-intent bitmap
	// cannot bring up to date: not this array's (or no superblock), a spare, its role held by
	// a working member (the array not degraded in that role), being rebuilt by a full rebuild
	// when it left (not a member that failed during its own re-add), or
	// an events counter older than the bitmap's last clear (EventsCleared: writes it missed
	// may no longer be marked), or an array without a bitmap. AddSpare (`raid5d add`) rebuilds
	// it fully instead.
	ErrCannotReAdd error = &ioError{"raid: member cannot be re-added (add it: a full rebuild)", uint32(unix.EINVAL)}
	// ErrBadSpeed is returned by SetSyncSpeed for a negative speed or min > max.
	ErrBadSpeed error = &ioError{"raid: invalid sync speed", uint32(unix.EINVAL)}
)

// Errors of Create, Assemble and Examine. They come wrapped in a *MemberError naming the member
// where one is to blame; test with errors.Is.
var (
	// ErrBadSuperblock is returned when a member has no valid raid5d superblock. The specific
	// reasons below (ErrBadMagic, ErrChecksum, ErrVersion) all match it with errors.Is too.
	ErrBadSuperblock = errors.New("raid: invalid superblock")
	// ErrBadMagic: the superblock area does not start with the raid5d magic (not a raid5d member).
	ErrBadMagic error = &superblockError{"raid: no raid5d superblock (bad magic)"}
	// ErrChecksum: the superblock's CRC32C does not match its contents.
	ErrChecksum error = &superblockError{"raid: superblock checksum mismatch"}
	// ErrVersion: the superblock has a format version this build does not know.
	ErrVersion error = &superblockError{"raid: unsupported superblock version"}

	// ErrForeignMember is returned by Assemble for a member whose array UUID differs from the
	// others': it belongs to another array.
	ErrForeignMember = errors.New("raid: member belongs to another array")
	// ErrOtherMember is the recheck's of a connection a member made by itself (a remote
	// member's reconnection, or one of its several connections, memberpkg.Rechecker): the
	// export through it carries another member of this array. It reaches the array wrapped in
	// the member's errors (nbdmember's ErrExportChanged), which fail the member; the recheck
	// of another array's member says ErrForeignMember.
	ErrOtherMember = errors.New("raid: a member's connection reaches another member of the array")
	// ErrDuplicateRole is returned by Assemble when two members claim the same role.
	ErrDuplicateRole = errors.New("raid: two members claim the same role")
	// ErrStaleMember is returned by Assemble, with ErrTooManyMissing, when members whose events
	// counter is behind the others' (or whom the others record as faulty) were left out and
	// too few were left: they missed writes while out of the array and need a rebuild. A stale
	// member that the array can do without is left out (or, with RebuildStale, rebuilt), not
	// refused.
	ErrStaleMember = errors.New("raid: member is stale (missed writes)")
	// ErrTooManyMissing is returned by Assemble when two or more roles have no member: RAID-5
	// survives the loss of one member only. Wrapped with ErrStaleMember when members given
	// were left out as stale, and with ErrNeedsForce when Force would assemble it.
	ErrTooManyMissing = errors.New("raid: too many members missing")
	// ErrNeedsForce is returned by Assemble, with ErrTooManyMissing, for a failed array that
	// AssembleOptions.Force (serve --force) can bring back: members the others record as
	// faulty stopped only when the array failed, so their data holds every acknowledged
	// write. The message names them and says what Force would do.
	ErrNeedsForce = errors.New("raid: the array failed; it can be assembled with Force")
	// ErrDirtyDegraded is returned by Assemble, inside a *DirtyDegradedError that names the
	// missing role and the regions at risk, for an array that was not shut down cleanly and
	// has a role with no member, when it has stripes whose parity may be torn (regions its
	// write-intent bitmap marks, or all of them without a bitmap): assembled degraded, the
	// missing member's chunks of those stripes would be computed from that parity and could
	// read wrong — the write hole — as md refuses to start a dirty degraded array. Nothing is
	// written: the member can still come back. AssembleOptions.Force (serve --force) assembles
	// it anyway, degraded, reporting the hole (Status.WriteHole); ReadOnly assembles it to
	// look at. An array with the journal policy replays its journal instead: no hole, no
	// refusal.
	ErrDirtyDegraded = errors.New("raid: dirty array with a member missing: the write hole")
	// ErrGeometry is returned by Assemble for a member whose superblock disagrees with the
	// others on the geometry (level, layout, chunk, member count, data offset or size).
	ErrGeometry = errors.New("raid: members disagree on the array geometry")
	// ErrMemberTooSmall is returned by Create and Assemble for a member too small for the array.
	ErrMemberTooSmall = errors.New("raid: member too small")
	// ErrDuplicateMember is returned by Create and Assemble when one file or device is given
	// twice, and by AddSpare and Replace for a path that is already a member or spare (under
	// any name).
	ErrDuplicateMember = errors.New("raid: the same member is given twice")
	// ErrConsistency is returned by Create for a consistency policy it does not implement ("ppl")
	// or does not know, and for the journal policy without a journal.
	ErrConsistency = errors.New("raid: consistency policy not implemented")
	// ErrInUse is returned by Create for a member or spare that already carries a valid raid5d
	// superblock, unless CreateOptions.Force is set; and by AddSpare and Replace for a path
	// that carries another array's superblock or journal, unless given Force.
	ErrInUse = errors.New("raid: member already carries a raid5d superblock")
	// ErrJournalOnMember is returned by Create and Assemble, before anything is written, when
	// the write journal is a member's own storage: the same file (a hard link, another path)
	// or block device as a member or spare, or a file on a member block device's filesystem.
	ErrJournalOnMember = errors.New("raid: write journal on a member's storage")
	// ErrNoMembers is returned by Assemble and Examine when no member could be read at all.
	ErrNoMembers = errors.New("raid: no usable member")
	// ErrBitmapRegion is returned by Create when CreateOptions.BitmapRegion gives a bitmap
	// that does not fit in the reserved area.
	ErrBitmapRegion = errors.New("raid: write-intent bitmap region too small: the bitmap does not fit in the reserved area")
	// ErrJournal is returned when a write journal is unusable: by Create and Assemble when its
	// header is corrupt, it belongs to another array or it is too small, and by the writing
	// methods when a record would not fit its ring or once writing it has failed (sticky
	// until the array is reassembled). It is journal.ErrUnusable.
	ErrJournal = journalpkg.ErrUnusable
	// ErrJournalCorrupt is returned by Assemble when the write journal of an array that was
	// not shut down cleanly has an unreadable record followed by records written after that
	// record had been made durable: the damage is not a write torn by the crash, and
	// replaying only the records before it could undo newer writes already on the members.
	// Nothing is replayed or written. AssembleOptions.SkipCorruptJournal assembles anyway:
	// it discards the journal and resyncs parity from the members' data. It is
	// journal.ErrCorrupt.
	ErrJournalCorrupt = journalpkg.ErrCorrupt
	// ErrJournalMissing is returned by Assemble for an array with the journal policy that was
	// not shut down cleanly when its journal cannot be found: the journal holds what a replay
	// needs, and assembling without it would leave stripes being written at the crash
	// inconsistent, with no resync to fix them.
	ErrJournalMissing = errors.New("raid: write journal missing")
	// ErrMemberBusy is returned, inside a *BusyError naming the holder, by OpenMember and so by
	// Create, Assemble and AddSpare (and for a journal) when the file or device is in use: another
	// raid5d holds its lock (or another open of it in this process does, or a read-write open
	// meets read-only ones), or the kernel holds a block device for exclusive use (mounted, part
	// of md or dm, or opened with O_EXCL by another program). Nothing has been written. Unlike
	// ErrInUse it is about a running user, not a superblock; Force does not override it.
	// It is member.ErrBusy.
	ErrMemberBusy = memberpkg.ErrBusy
	// ErrUnknownMemberKind is returned, inside a *member.UnknownKindError naming the spec and
	// the registered kinds, by OpenMember and so by Create, Assemble and AddSpare, and by
	// MapSpecPath, for a spec of the form scheme://... of no registered kind (a typo'd nbd://
	// URI). Assemble fails with it rather than counting the member as missing. It is
	// member.ErrUnknownKind.
	ErrUnknownMemberKind = memberpkg.ErrUnknownKind
)

type ioError struct {
	msg   string
	errno uint32
}

func (e *ioError) Error() string         { return e.msg }
func (e *ioError) Errno() uint32         { return e.errno }
func (e *superblockError) Error() string { return e.msg }

type superblockError struct{ msg string }

// Is makes every specific superblock error match ErrBadSuperblock.
func (e *superblockError) Is(target error) bool { return target == ErrBadSuperblock }

// Range is a run of the array's bytes: [Off, Off+Len).
type Range struct{ Off, Len int64 }

// DirtyDegradedError is Assemble's refusal of a dirty array with a role missing
// (errors.Is(err, ErrDirtyDegraded)): see ErrDirtyDegraded.
type DirtyDegradedError struct {
	Array UUID
	Role  int // the role with no member
	// FailedBefore: the superblocks record Role as faulty: it failed before the crash, so no
	// member of it can close the hole. Otherwise its member was simply not there (Absent):
	// bring it back.
	FailedBefore bool
	// Absent are the paths Assemble was given that were not found or did not answer (one
	// of them is presumably Role's member).
	Absent []string
	// Regions are the array's bytes whose parity may be torn (the pending resync: merged
	// write-intent regions, or the whole array without a bitmap), Pending of Total regions.
	Regions        []Range
	Pending, Total int
}

// maxRangesShown is how many of DirtyDegradedError.Regions its message lists.
const maxRangesShown = 8

func (e *DirtyDegradedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: array %s was not shut down cleanly and role %d has no member", ErrDirtyDegraded, e.Array, e.Role)
	if len(e.Absent) > 0 {
		fmt.Fprintf(&b, " (not found or not answering: %s)", strings.Join(e.Absent, ", "))
	}
	fmt.Fprintf(&b, "; the parity of %d of %d regions may be torn by the writes under way at the crash:", e.Pending, e.Total)
	for i, r := range e.Regions {
		if i == maxRangesShown {
			fmt.Fprintf(&b, " and %d more", len(e.Regions)-i)
			break
		}
		fmt.Fprintf(&b, " [%d, %d)", r.Off, r.Off+r.Len)
	}
	fmt.Fprintf(&b, " (array bytes); assembled degraded, role %d's chunks there would be computed from that parity and could read wrong (the write hole). ", e.Role)
	if e.FailedBefore {
		fmt.Fprintf(&b, "Role %d failed before the crash, so nothing can close the hole now: ", e.Role)
	} else {
		fmt.Fprintf(&b, "Bring role %d's member back (it missed nothing: the array then resyncs those regions and is whole), or ", e.Role)
	}
	b.WriteString("assemble it anyway with Force (serve --force: degraded, the hole reported; check the file system), or ReadOnly (serve --read-only) to look at it first")
	return b.String()
}

func (e *DirtyDegradedError) Unwrap() error { return ErrDirtyDegraded }

// MemberError records an error on one member, in the manner of fs.PathError.
type MemberError struct {
	Member string // the member's name (its path)
	Role   int    // its role in the array, -1 if not known
	Op     string // "read", "write", "sync", "trim", "open", "read superblock", "assemble", ...
	Off    int64  // member offset of the failed I/O, -1 if none
	Err    error
}

func (e *MemberError) Error() string {
	s := "raid: " + e.Op + " " + e.Member
	if e.Role >= 0 {
		s += fmt.Sprintf(" (role %d)", e.Role)
	}
	if e.Off >= 0 {
		s += fmt.Sprintf(" at offset %d", e.Off)
	}
	return s + ": " + e.Err.Error()
}

func (e *MemberError) Unwrap() error { return e.Err }

// Errno is EIO for member I/O errors, or the errno of the wrapped error if it has one.
func (e *MemberError) Errno() uint32 {
	var en interface{ Errno() uint32 }
	if errors.As(e.Err, &en) {
		return en.Errno()
	}
	return uint32(unix.EIO)
}

func memberErr(m Member, role int, op string, off int64, err error) error {
	if err == nil {
		return nil
	}
	return &MemberError{Member: m.Name(), Role: role, Op: op, Off: off, Err: err}
}
