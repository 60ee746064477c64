package raid

import (
	"time"

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
// bitmap), so that no bit is cleared until Close: tests that count bitmap writes call it.
func StopBitmapCleaner(a *Array) {
	if a.bm != nil {
		a.bm.Stop()
	}
}

// JournalOp is one op of a journal record, for the record tests: Data written at member
// offset Off of Role, or with Data nil, Trim bytes trimmed there.
type JournalOp struct {
	Role int
	Off  int64
	Data []byte
	Trim int64
}

// EncodeJournalRecord encodes and seals a journal record as the write path does (commit: its
// group's commit point, at most seq).
func EncodeJournalRecord(uuid UUID, s0, n int64, ops []JournalOp, seq, lsn, commit uint64) []byte {
	iops := make([]intentOp, len(ops))
	for i, op := range ops {
		iops[i] = intentOp{role: op.Role, off: op.Off, buf: op.Data, trim: op.Trim}
	}
	b := encodeRecord(nil, uuid, s0, n, iops)
	sealRecord(b, seq, lsn, commit)
	return b
}

// DecodeJournalRecord decodes a whole record (both checksums checked), as the replay does.
func DecodeJournalRecord(b []byte) (uuid UUID, seq, lsn, commit uint64, s0, n int64, ops []JournalOp, err error) {
	r, err := decodeRecord(b)
	if err != nil {
		return uuid, 0, 0, 0, 0, 0, nil, err
	}
	p := r.hdrLen
	for _, op := range r.ops {
		jo := JournalOp{Role: op.role, Off: op.off}
		if op.trim {
			jo.Trim = op.n
		} else {
			jo.Data = b[p : p+op.n]
			p += op.n
		}
		ops = append(ops, jo)
	}
	return r.uuid, r.seq, r.lsn, r.commit, r.s0, r.n, ops, nil
}

// JournalPosition returns the journal's head and tail (logical byte positions), the
// sequence number of the next record, and the ring's size; ok is false without a journal.
func JournalPosition(a *Array) (head, tail, seq uint64, ring int64, ok bool) {
	j := a.jr
	if j == nil {
		return 0, 0, 0, 0, false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.head, j.tail, j.seq, j.ringSize, true
}

// JournalRingOffset is where the ring starts on the journal device.
const JournalRingOffset = journalRingOffset
