package raid

import (
	"fmt"
	"io"

	"github.com/raid5d/raid5d/internal/aligned"
	memberpkg "github.com/raid5d/raid5d/raid/member"
)

// newMember is m as a member of the array with superblock sb (the one it carries, or the
// one the array is about to write onto it).
func newMember(m Member, sb *superblock) *member {
	return &member{Member: m, sb: sb}
}

// checkConns tells m, of role (spareRole: a spare), whose export carries the superblock of
// array with device UUID device now (read from it, or written onto it), to check every
// connection it uses against that identity (recheck): those it uses now, those it opens for
// more at once, and every reconnection (memberpkg.Rechecker: a remote member). Until then such
// a member has used only the connection the array identified it through. It returns nil for
// other members; an error, a *MemberError of op (a connection reaches another export: the
// member has failed), means m must not be used.
func checkConns(m *member, array, device UUID, role int, op string) error {
	r, ok := memberpkg.Base(m.Member).(memberpkg.Rechecker)
	if !ok {
		return nil
	}
	if err := r.SetRecheck(recheck(array, device)); err != nil {
		return &MemberError{Member: m.Name(), Role: role, Op: op, Off: SuperblockOffset, Err: err}
	}
	return nil
}

// recheck returns the check of a member's export through a connection it makes by itself:
// it must carry a valid superblock of array with device UUID device. Anything else (another
// array's member: ErrForeignMember; another member of this one: ErrOtherMember; a blank or
// corrupt superblock: the decoder's error) fails the member: a server that came back with
// another disk behind the same URI, or that routes one of the member's connections to
// another, is never read as this member. The identity is fixed for the member's life
// (events, roles and states change; the UUIDs do not), so the check needs no lock.
func recheck(array, device UUID) func(io.ReaderAt) error {
	return func(r io.ReaderAt) error {
		buf := aligned.Make(SuperblockSize)
		if _, err := r.ReadAt(buf, SuperblockOffset); err != nil {
			return err
		}
		sb, err := decodeSuperblock(buf)
		switch {
		case err != nil:
			return err
		case sb.ArrayUUID != array:
			return fmt.Errorf("%w: its superblock is of array %s, not %s", ErrForeignMember, sb.ArrayUUID, array)
		case sb.DeviceUUID != device:
			return fmt.Errorf("%w: its superblock is of device %s (role %d), not %s", ErrOtherMember, sb.DeviceUUID, sb.Role, device)
		}
		return nil
	}
}
