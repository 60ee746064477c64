package raid

// StopJournalCheckpointer stops the background checkpointer of a writable journaled array
// and waits until it has returned, so that the journal's tail moves no more except by a
// writer that finds the ring full (or Close). Tests call it before taking a position snapshot
// (JournalPosition) that must still hold at a power cut.
func StopJournalCheckpointer(a *Array) {
	a.jr.stopRun()
	<-a.jr.runDone
}

// ResealJournalRecord rewrites the sequence number, position and commit point of the record
// in b and its header checksum, as the leader of a group commit does.
func ResealJournalRecord(b []byte, seq, lsn, commit uint64) { sealRecord(b, seq, lsn, commit) }

// JournalNeedsResync reports whether the journal's header flags a full resync to follow any
// replay (a corrupt journal was discarded and the resync has not finished).
func JournalNeedsResync(a *Array) bool {
	a.jr.cpMu.Lock()
	defer a.jr.cpMu.Unlock()
	return a.jr.needResync
}
