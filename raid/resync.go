package raid

import (
	"context"
	"sync/atomic"
	"time"
)

// resyncSet is the part of the array whose parity may not match its data after an unclean
// shutdown: regions of regionStripes stripes, pending until the resync has rewritten their
// parity from their data and made it durable. The slice is fixed at assembly; the flags are
// atomic (read on the write path, cleared by the resync).
type resyncSet struct {
	regionStripes int64
	pending       []atomic.Bool
	full          bool // every region: no usable write-intent bitmap
}

// newResyncSet returns a set of regions of regionStripes stripes covering stripes stripes, with
// the regions for which dirty returns true pending (nil dirty: all of them).
func newResyncSet(stripes, regionStripes int64, dirty func(r int64) bool) *resyncSet {
	n := (stripes + regionStripes - 1) / regionStripes
	rs := &resyncSet{regionStripes: regionStripes, pending: make([]atomic.Bool, n), full: dirty == nil}
	for r := range n {
		rs.pending[r].Store(dirty == nil || dirty(r))
	}
	return rs
}

// newResync returns the regions to resync after an unclean shutdown: those whose bit is set in
// the write-intent bitmap (the union of the members'), or every region if the array has no
// bitmap or it cannot be read.
func (a *Array) newResync() *resyncSet {
	stripes := a.memberData / a.layout.ChunkSize()
	if a.bm == nil {
		return newResyncSet(stripes, max(stripes/64, 1), nil)
	}
	bits, err := a.bm.load()
	if err != nil {
		a.log.Warn("raid: write-intent bitmap unreadable; resyncing the whole array", "err", err)
		return newResyncSet(stripes, a.bm.regionStripes, nil)
	}
	return newResyncSet(stripes, a.bm.regionStripes, func(r int64) bool { return bits[r/8]&(1<<(r%8)) != 0 })
}

// count returns how many regions are pending.
func (rs *resyncSet) count() int {
	n := 0
	for i := range rs.pending {
		if rs.pending[i].Load() {
			n++
		}
	}
	return n
}

// needsRCW reports whether stripe s may still have stale parity (an unfinished resync has not
// reached it): a partial write to it must then reconstruct-write — parity from the data —
// never read-modify-write, which would carry the stale parity forward. The caller holds s's
// lock (the resync moves past s only under it).
func (a *Array) needsRCW(s int64) bool {
	rs := a.resync
	if rs == nil {
		return false
	}
	return rs.pending[s/rs.regionStripes].Load() && s >= a.resyncPos.Load()
}

// resyncPending reports whether any region still waits for the resync.
func (a *Array) resyncPending() bool { return a.resync != nil && a.resync.count() > 0 }

// maybeResync starts the resync if regions are pending, every member is there and nothing
// else runs: at start, and when a rebuild ends. A degraded array cannot be resynced (parity is
// needed to rebuild the missing chunks): the write hole, see Status.WriteHole.
func (a *Array) maybeResync() {
	if a.readOnly || !a.resyncPending() || a.nBad.Load() > 0 {
		return
	}
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	if a.running() != nil {
		return
	}
	a.startJobLocked("resync", -1, true, a.runResync)
}

// runResync rewrites the parity of every stripe of the pending regions from its data, in
// ascending order, batch by batch under the stripes' locks (dirty cache heads written out
// first), as a repairing scrub does, at the sync speed limits. After each region it syncs the
// members and only then drops the region from the set (and lets its write-intent bit be
// cleared): the bitmap is the resync's checkpoint. When no region is left the array counts as
// cleanly assembled again (Close marks it clean).
func (a *Array) runResync(ctx context.Context, j *syncJob) error {
	rs := a.resync
	C := a.layout.ChunkSize()
	stripes := a.memberData / C
	var regions []int64
	total := int64(0)
	for r := range int64(len(rs.pending)) {
		if rs.pending[r].Load() {
			regions = append(regions, r)
			total += (min((r+1)*rs.regionStripes, stripes) - r*rs.regionStripes) * C
		}
	}
	a.syncMu.Lock()
	j.p.Total = total
	a.syncMu.Unlock()
	a.log.Info("raid: resync started: recomputing parity of the regions written at the unclean shutdown",
		"regions", len(regions), "of", len(rs.pending), "bytes_per_member", total, "full", rs.full)
	batch := a.syncBatch()
	bufs := make([][]byte, a.layout.Members()+1)
	for i := range bufs {
		bufs[i] = make([]byte, batch*C)
	}
	t := a.newThrottle()
	done := int64(0)
	for _, r := range regions {
		s0, s1 := r*rs.regionStripes, min((r+1)*rs.regionStripes, stripes)
		if a.resyncPos.Load() < s0 {
			a.resyncPos.Store(s0) // only moves past regions not pending
		}
		for pos := s0; pos < s1; {
			if err := ctx.Err(); err != nil {
				return a.resyncStopped(err)
			}
			k := min(batch, s1-pos)
			a.locks.LockSpan(pos, k)
			bad, err := a.scrubSpan(pos, k, bufs, true)
			if err == nil {
				a.resyncPos.Store(pos + k)
			}
			a.locks.UnlockSpan(pos, k)
			if err != nil {
				return a.resyncStopped(err)
			}
			a.syncMu.Lock()
			for _, s := range bad {
				j.p.Mismatches++
				if len(j.p.MismatchAt) < maxMismatchAt {
					j.p.MismatchAt = append(j.p.MismatchAt, s)
				}
			}
			a.syncMu.Unlock()
			pos += k
			done += k * C
			a.setDone(j, t, done)
			if err := t.wait(ctx, k*C); err != nil {
				return a.resyncStopped(err)
			}
		}
		if err := a.syncMembers(); err != nil {
			return a.resyncStopped(err)
		}
		rs.pending[r].Store(false)
		if a.bm != nil {
			a.bm.release(r)
		}
	}
	a.sbMu.Lock()
	a.unclean = false
	a.sbMu.Unlock()
	a.syncMu.Lock()
	fixed := j.p.Mismatches
	a.syncMu.Unlock()
	a.log.Info("raid: resync finished; parity is consistent", "stripes_fixed", fixed,
		"seconds", time.Since(j.start).Seconds())
	return nil
}

// resyncStopped records why a resync stopped; if the array is degraded now, the regions left
// are the write hole.
func (a *Array) resyncStopped(err error) error {
	if a.nBad.Load() > 0 {
		a.noteWriteHole()
	}
	return err
}

// noteWriteHole says, loudly, that stripes written at an unclean shutdown could not be
// resynced because a member is missing: their parity may be wrong, so the chunks a rebuild
// or a degraded read computes from it may be wrong too — the RAID-5 write hole.
func (a *Array) noteWriteHole() {
	if a.writeHole.Swap(true) {
		return
	}
	n := 0
	if a.resync != nil {
		n = a.resync.count()
	}
	a.log.Error("raid: WRITE HOLE: the array was not shut down cleanly and is degraded; parity of the stripes being written at the crash cannot be checked, and chunks of the missing member rebuilt from it may be wrong",
		"regions", n)
}
