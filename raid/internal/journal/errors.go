package journal

import "errors"

var (
	// ErrUnusable is returned when a write journal is unusable: its header is corrupt, it
	// belongs to another array, it is too small, or writing it failed (Init, ReadHeader,
	// Log, Checkpoint, Recover).
	ErrUnusable = errors.New("raid: write journal unusable")

	// ErrCorrupt is returned by Recover when the journal of an array that was not shut down
	// cleanly has an unreadable record followed by records written after that record had
	// been made durable: the damage is not a write torn by the crash, and replaying only the
	// records before it could undo newer writes already on the members. Nothing is replayed
	// or written. Recover with skipCorrupt discards the journal instead and asks for a full
	// resync.
	ErrCorrupt = errors.New("raid: write journal corrupt")

	// errBadRecord marks the end of the journal's valid records during a replay (never
	// returned).
	errBadRecord = errors.New("raid: not a valid journal record")
)
