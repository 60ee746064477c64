package raid

// StopJournalCheckpointer stops the background checkpointer of a writable journaled array
// and waits until it has returned, so that the journal's tail moves no more except by a
// writer that finds the ring full (or Close). Tests call it before taking a position snapshot
// (JournalPosition) that must still hold at a power cut.
func StopJournalCheckpointer(a *Array) {
	a.jr.stopRun()
	<-a.jr.runDone
}
