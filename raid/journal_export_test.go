package raid

import "github.com/raid5d/raid5d/raid/internal/journal"

// StopJournalCheckpointer stops the background checkpointer of a writable journaled array
// and waits until it has returned, so that the journal's tail moves no more except by a
// writer that finds the ring full (or Close). Tests call it before taking a position snapshot
// (JournalPosition) that must still hold at a power cut.
func StopJournalCheckpointer(a *Array) {
	a.jr.Stop()
	<-a.jr.Stopped()
}

// ResealJournalRecord rewrites the sequence number, position and commit point of the record
// in b and its header checksum, as the leader of a group commit does.
func ResealJournalRecord(b []byte, seq, lsn, commit uint64) { journal.SealRecord(b, seq, lsn, commit) }

// JournalNeedsResync reports whether the journal's header flags a full resync to follow any
// replay (a corrupt journal was discarded and the resync has not finished).
func JournalNeedsResync(a *Array) bool { return a.jr.NeedsResync() }
