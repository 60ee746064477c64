package raid

import "time"

// SetUnsafeReference is a test-only switch: WriteAt then skips the copy and keeps references
// to the caller's buffer as if it were pinned, without any promise that it stays unchanged.
// It exists to show the hazard that stable pages and pinning avoid; never use it otherwise.
func SetUnsafeReference(a *Array, on bool) { a.unsafeRef = on }

// SuperblockInfo decodes m's superblock: its role (-1 for a spare), events counter, per-role
// state table (0 active, 1 faulty, 2 rebuilding) and rebuild checkpoint in bytes.
func SuperblockInfo(m Member) (role int, events uint64, states []uint8, recovery int64, err error) {
	sb, err := readSuperblock(m)
	if err != nil {
		return 0, 0, nil, 0, err
	}
	return sb.Role, sb.Events, sb.States[:sb.Members], sb.Recovery, nil
}

// SyncThrottle exposes syncThrottle.
var SyncThrottle = syncThrottle

// CleanBitmap runs one pass of the write-intent bitmap's cleaner at once, clearing the bits of
// regions with no write begun for idle (and none in flight), as the background cleaner does
// every second with BitmapClearDelay. It reports whether the array has a bitmap.
func CleanBitmap(a *Array, idle time.Duration) bool {
	if a.bm == nil {
		return false
	}
	a.bm.clean(idle)
	return true
}
