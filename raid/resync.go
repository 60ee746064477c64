package raid

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/raid/internal/bitmap"
)

// resyncSet is the part of the array whose parity may not match its data after an unclean
// shutdown: regions of regionStripes stripes, pending until the resync has rewritten their
// parity from their data and made it durable. The slice is fixed at assembly; the flags are
// atomic (read on the write path, cleared by the resync).
type resyncSet struct {
	regionStripes int64
	pending       []atomic.Bool
	full          bool // every region: no usable write-intent bitmap
	// from is the stripe a full resync resumes at (Array.resumePoint), 0 if it starts at
	// the beginning: the stripes below it are consistent and the regions wholly below it
	// are not pending.
	from int64
}

// newResyncSet returns a set of regions of regionStripes stripes covering stripes stripes, with
// the regions for which dirty returns true pending (nil dirty: all of them, but those wholly
// below stripe from).
func newResyncSet(stripes, regionStripes, from int64, dirty func(r int64) bool) *resyncSet {
	n := (stripes + regionStripes - 1) / regionStripes
	rs := &resyncSet{regionStripes: regionStripes, pending: make([]atomic.Bool, n), full: dirty == nil, from: from}
	for r := range n {
		rs.pending[r].Store((r+1)*regionStripes > from && (dirty == nil || dirty(r)))
	}
	return rs
}

// ranges returns the array bytes of the pending regions, adjacent ones merged: stripes
// stripes of stripeSize bytes. From is honoured (the stripes below it are not pending).
func (rs *resyncSet) ranges(stripes, stripeSize int64) []Range {
	var out []Range
	for r := range int64(len(rs.pending)) {
		if !rs.pending[r].Load() {
			continue
		}
		s0, s1 := max(r*rs.regionStripes, rs.from), min((r+1)*rs.regionStripes, stripes)
		if n := len(out); n > 0 && out[n-1].Off+out[n-1].Len == s0*stripeSize {
			out[n-1].Len += (s1 - s0) * stripeSize
			continue
		}
		out = append(out, Range{Off: s0 * stripeSize, Len: (s1 - s0) * stripeSize})
	}
	return out
}

// newResync returns the regions to resync after an unclean shutdown: those whose bit is set in
// the write-intent bitmap (the union of the members'), or every region if the array has no
// bitmap or it cannot be read, but those below from (stripes: where a full resync stopped
// cleanly, see resumePoint; 0 with a bitmap, which is its own checkpoint).
func (a *Array) newResync(from int64) *resyncSet {
	stripes := a.memberData / a.layout.ChunkSize()
	if a.bm == nil {
		a.resyncPos.Store(from) // the stripes below it need no reconstruct-write (needsRCW)
		return newResyncSet(stripes, max(stripes/64, 1), from, nil)
	}
	bits, err := a.bm.Load()
	if errors.Is(err, bitmap.ErrCorrupt) {
		err = fmt.Errorf("%w: %w", ErrBadSuperblock, err)
	}
	if err != nil {
		a.log.Warn("raid: write-intent bitmap unreadable; resyncing the whole array", "err", err)
		return newResyncSet(stripes, a.bm.RegionStripes(), 0, nil)
	}
	return newResyncSet(stripes, a.bm.RegionStripes(), 0, bits.Has)
}

// resumePoint returns the stripe at which the resync of an array assembled dirty may resume:
// where a full resync stood when the array was last stopped cleanly (superblock Resync, from
// the reference superblock ref), 0 if none. Unless the array is read-only it then clears the
// point from every superblock, durably, before the array takes its first write; if that
// fails it returns 0 (resyncing everything is always safe).
//
// Why a crash must not resume: the point says that parity below it matched the data when
// Close recorded it, everything being written and synced. Once the array serves again,
// writes land below the point too, and a crash can tear any of them (one member's chunk
// written, the parity not, or the reverse); nothing records which stripes were written, so
// after a crash the whole array is suspect again. With the point gone from the superblocks,
// a crash leaves them dirty with no resume point, and the next assembly resyncs from stripe
// 0; a clean stop records the resync's new position (recordResyncStop).
func (a *Array) resumePoint(ref *superblock, readOnly bool) int64 {
	if ref.Resync <= 0 || a.bm != nil || a.jr != nil {
		return 0
	}
	from := min(ref.Resync, a.memberData) / a.layout.ChunkSize()
	if readOnly {
		return from // nothing is written, so nothing can tear
	}
	a.sbMu.Lock()
	for _, m := range a.all() {
		m.sb.Resync = 0
	}
	err := a.writeSuperblocks(nil)
	a.sbMu.Unlock()
	if err != nil {
		a.log.Warn("raid: clearing the resync's resume point from the superblocks failed; resyncing the whole array",
			"position", ref.Resync, "err", err)
		return 0
	}
	a.log.Info("raid: the resync stopped cleanly last time; resuming it", "position", from*a.layout.ChunkSize())
	return from
}

// recordResyncStop records, when Close has stopped a full resync in the middle, how far it got
// (superblock Resync), so that the next assembly resumes there. It first writes out the
// cache and syncs the members, so that every stripe below the position is consistent on
// disk; the superblocks stay dirty. Close calls it (through stopAllSync) once the resync
// has ended and no client call is in flight. Arrays with a bitmap need none of this: their
// bitmap keeps the regions not yet resynced.
func (a *Array) recordResyncStop() {
	rs := a.resync
	if a.readOnly || rs == nil || !rs.full || a.bm != nil || a.jr != nil || !a.resyncPending() || a.roles.failed() {
		return
	}
	pos := a.resyncPos.Load()
	a.sbMu.Lock()
	unclean := a.unclean
	a.sbMu.Unlock()
	if !unclean || pos <= 0 {
		return
	}
	var err error
	if a.cache != nil {
		err = a.cache.Flush()
	}
	if err = errors.Join(err, a.syncMembers()); err != nil {
		a.log.Warn("raid: the stopped resync's position cannot be recorded; the next assembly resyncs the whole array", "err", err)
		return
	}
	C := a.layout.ChunkSize()
	a.sbMu.Lock()
	err = a.writeSuperblocks(func(sb *superblock) { sb.Dirty, sb.Resync = true, pos*C })
	a.sbMu.Unlock()
	if err != nil {
		a.log.Warn("raid: recording the stopped resync's position failed", "position", pos*C, "err", err)
		return
	}
	a.log.Info("raid: resync stopped; the next assembly resumes it", "position", pos*C, "of", a.memberData)
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

// isPending reports whether the region holding stripe s is pending (false for a nil set).
func (rs *resyncSet) isPending(s int64) bool {
	return rs != nil && rs.pending[s/rs.regionStripes].Load()
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
	if a.readOnly || a.resync == nil {
		return
	}
	if !a.resyncPending() {
		// Assembled dirty with nothing to resync (no bit set in the bitmap, or a resync
		// that had reached the end when it was stopped): parity is consistent, so Close
		// may mark the array clean again.
		a.sbMu.Lock()
		a.unclean = false
		a.sbMu.Unlock()
		return
	}
	if a.roles.degraded() {
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
// cleared): the bitmap is the resync's checkpoint. Without a bitmap the checkpoint is the
// position Close records when it stops the resync (recordResyncStop); a resumed resync
// starts at it and says so in Progress.Resumed. When no region is left the array counts as
// cleanly assembled again (Close marks it clean).
func (a *Array) runResync(ctx context.Context, j *syncJob) error {
	rs := a.resync
	C := a.layout.ChunkSize()
	stripes := a.memberData / C
	// A resumed resync counts the stripes below its resume point as done, as a resumed
	// rebuild does: Done and Total then read as the position in the array.
	var regions []int64
	done := rs.from * C
	total := done
	for r := range int64(len(rs.pending)) {
		if rs.pending[r].Load() {
			regions = append(regions, r)
			total += (min((r+1)*rs.regionStripes, stripes) - max(r*rs.regionStripes, rs.from)) * C
		}
	}
	a.syncMu.Lock()
	j.p.Total, j.p.Done, j.p.Resumed, j.base = total, done, done, done
	a.syncMu.Unlock()
	a.log.Info("raid: resync started: recomputing parity of the regions written at the unclean shutdown",
		"regions", len(regions), "of", len(rs.pending), "bytes_per_member", total-done, "full", rs.full, "resumed_from", done)
	batch := a.syncBatch()
	bufs := make([][]byte, a.layout.Members()+1)
	for i := range bufs {
		bufs[i] = aligned.Make(int(batch * C)) // members read into it: aligned for direct I/O
	}
	t := a.newThrottle()
	for _, r := range regions {
		s0, s1 := max(r*rs.regionStripes, rs.from), min((r+1)*rs.regionStripes, stripes)
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
			a.addMismatches(j, bad)
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
			a.bm.Release(r)
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
	if a.roles.degraded() {
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
