package raid

import (
	"fmt"
	"io"

	"github.com/raid5d/raid5d/internal/aligned"
	memberpkg "github.com/raid5d/raid5d/raid/member"
)

// newMember is m as a member of the array with superblock sb (the one it carries, or the
// one the array is about to write onto it). A member that reconnects by itself
// (memberpkg.Rechecker: a remote member) is told to recheck every reconnection against sb's
// identity (recheck) before it uses it.
func newMember(m Member, sb *superblock) *member {
	if r, ok := memberpkg.Base(m).(memberpkg.Rechecker); ok {
		r.SetRecheck(recheck(sb.ArrayUUID, sb.DeviceUUID))
	}
	return &member{Member: m, sb: sb}
}

// recheck returns the check of a reconnected member's export: it must carry a valid
// superblock of array with device UUID device. Anything else (another array's member:
// ErrForeignMember; another member of this one: ErrOtherMember; a blank or corrupt superblock:
// the decoder's error) fails the member: a server that came back with another disk behind
// the same URI is never read as this member. The identity is fixed for the member's life
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
