package raid

import (
	"bytes"
	"errors"
	"testing"
)

// TestRecheck: the recheck of a reconnected member passes only its own superblock: the same
// array and device UUIDs whatever its events, role or state; another array's member is
// ErrForeignMember, another member of this array ErrOtherMember, a blank or corrupt
// superblock the decoder's error, and a read error is returned as it is.
func TestRecheck(t *testing.T) {
	array, device := newUUID(), newUUID()
	export := func(sb *superblock) *bytes.Reader {
		b := make([]byte, SuperblockOffset+SuperblockSize)
		if sb != nil {
			sb.encode(b[SuperblockOffset:])
		}
		return bytes.NewReader(b)
	}
	own := superblock{ArrayUUID: array, DeviceUUID: device, Level: level5, Members: 4, Chunk: 64 << 10, Role: 1,
		DataOffset: DataOffset, DataSize: 1 << 20, Events: 9}
	check := recheck(array, device)
	later := own
	later.Events, later.Role, later.Dirty = 12, 1, true
	for _, sb := range []superblock{own, later} {
		if err := check(export(&sb)); err != nil {
			t.Errorf("its own superblock (events %d): %v", sb.Events, err)
		}
	}
	other, foreign := own, own
	other.DeviceUUID, other.Role = newUUID(), 2
	foreign.ArrayUUID = newUUID()
	if err := check(export(&other)); !errors.Is(err, ErrOtherMember) {
		t.Errorf("another member of the array: %v, want ErrOtherMember", err)
	}
	if err := check(export(&foreign)); !errors.Is(err, ErrForeignMember) {
		t.Errorf("another array's member: %v, want ErrForeignMember", err)
	}
	if err := check(export(nil)); !errors.Is(err, ErrBadMagic) {
		t.Errorf("a blank export: %v, want ErrBadMagic", err)
	}
	short := bytes.NewReader(make([]byte, SuperblockOffset)) // ReadAt says io.EOF
	if err := check(short); err == nil {
		t.Error("an export too short for a superblock: no error")
	}
}
