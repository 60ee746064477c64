package raid

import (
	"time"

	"github.com/raid5d/raid5d/raid/internal/journal"
	"github.com/raid5d/raid5d/raid/member/faulty"
)

// The tests open faulty: and volatile: specs as the daemon does, which registers them.
func init() { faulty.Register(DataOffset) }

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
	a.bm.Clean(idle)
	return true
}

// StopBitmapCleaner stops the write-intent bitmap's background cleaner (if the array has a
// bitmap), so that no bit is cleared until Close: tests that count bitmap writes or member
// syncs, or need a bit still set later, call it before their first write. Without it a
// region idle for BitmapClearDelay (a slow, loaded machine) has its bit cleared, its members
// synced and the bitmap written by the cleaner, whenever its next tick comes.
func StopBitmapCleaner(a *Array) {
	if a.bm != nil {
		a.bm.Stop()
	}
}

// JournalRecordSeq decodes a whole journal record (both checksums checked), as the replay
// does, and returns its sequence number.
func JournalRecordSeq(b []byte) (uint64, error) {
	r, err := journal.DecodeRecord(b)
	if err != nil {
		return 0, err
	}
	return r.Seq(), nil
}

// JournalPosition returns the journal's head and tail (logical byte positions), the
// sequence number of the next record, and the ring's size; ok is false without a journal.
func JournalPosition(a *Array) (head, tail, seq uint64, ring int64, ok bool) {
	if a.jr == nil {
		return 0, 0, 0, 0, false
	}
	head, tail, seq, ring = a.jr.Position()
	return head, tail, seq, ring, true
}

// JournalRingOffset is where the ring starts on the journal device.
const JournalRingOffset = journal.RingOffset
