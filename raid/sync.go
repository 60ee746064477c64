package raid

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/raid/internal/journal"
)

// Defaults of IOOptions.SyncSpeedMin and SyncSpeedMax, as md's sync_speed_min/max (1000 and
// 200000 KiB/s, here in bytes/s).
const (
	DefaultSyncSpeedMin = 1 << 20
	DefaultSyncSpeedMax = 200 << 20
)

// Progress describes a rebuild or scrub.
type Progress struct {
	Kind        string        // "rebuild", "check", "repair" or "resync"
	Role        int           // rebuild: the role being rebuilt; -1 otherwise
	Done, Total int64         // bytes of the member data area
	BytesPerSec float64       // member data-area bytes per second since this run started
	ETA         time.Duration // at that speed
	Mismatches  int64         // check/repair/resync: stripes whose parity did not match (so far); repair and resync rewrote it
	MismatchAt  []int64       // the first (at most maxMismatchAt) such stripe numbers
	Resumed     int64         // rebuild, full resync: the checkpoint it resumed from (bytes), 0 if none
	// ReAdd: the rebuild is a re-add's (ReAdd): only the regions the write-intent bitmap
	// marks are resynced. Resynced: rebuild: bytes of the data area written onto the member
	// so far (a full rebuild: Done-Resumed; a re-add: the marked regions only).
	ReAdd    bool
	Resynced int64
	Err      string // why it stopped early, if it did
}

const maxMismatchAt = 100

// Sync tuning: bytes of each member a rebuild, scrub, resync or re-add handles under one set
// of stripe locks, how often a full rebuild records its position, how often progress is
// logged.
const (
	syncBatchBytes  = 1 << 20
	checkpointEvery = time.Second
	logEvery        = 5 * time.Second
)

// syncBatch returns how many stripes a sync handles under one set of locks: syncBatchBytes
// of each member, but at least 64 batches in all (small arrays), and at least one stripe.
func (a *Array) syncBatch() int64 {
	C := a.layout.ChunkSize()
	return max(min(syncBatchBytes/C, a.memberData/C/64), 1)
}

// syncJob is the background rebuild or scrub. Its progress fields are guarded by Array.syncMu.
type syncJob struct {
	kind    string
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	running bool
	p       Progress
	start   time.Time
	base    int64 // Done when this run started
	// after is the resync this job waits for before it starts, nil if none; stopping this
	// job for a failure or Close stops it too.
	after *syncJob
}

func (j *syncJob) progress() Progress {
	p := j.p
	p.MismatchAt = append([]int64(nil), p.MismatchAt...)
	if el := time.Since(j.start).Seconds(); el > 0 {
		p.BytesPerSec = float64(p.Done-j.base) / el
	}
	if p.BytesPerSec > 0 {
		p.ETA = time.Duration(float64(p.Total-p.Done) / p.BytesPerSec * float64(time.Second))
	}
	return p
}

// startJob starts fn as the array's background job of kind, after prev (if any) has ended.
// wait says whether a running job makes it fail with ErrBusy (false: it is cancelled instead).
// The caller holds syncMu.
func (a *Array) startJobLocked(kind string, role int, busyFails bool, fn func(ctx context.Context, j *syncJob) error) (*syncJob, error) {
	if a.closing {
		return nil, ErrClosed
	}
	prev := a.running()
	var after *syncJob
	switch {
	case prev == nil || !prev.running:
	case prev.kind == "resync" && kind != "rebuild":
		after = prev // a scrub waits for the resync (which makes parity worth checking)
	case busyFails:
		return nil, ErrBusy
	default:
		prev.cancel()
		if prev.after != nil {
			prev.after.cancel()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := &syncJob{kind: kind, ctx: ctx, cancel: cancel, done: make(chan struct{}), running: true,
		p: Progress{Kind: kind, Role: role, Total: a.memberData}, start: time.Now(), after: after}
	a.job = j
	a.bgWG.Go(func() {
		defer close(j.done)
		defer cancel()
		var err error
		switch {
		case after != nil: // stopping this job must not wait for the resync
			select {
			case <-after.done:
			case <-ctx.Done():
			}
			err = ctx.Err()
		case prev != nil:
			<-prev.done
			if prev.after != nil {
				<-prev.after.done
			}
		}
		if err == nil {
			err = fn(ctx, j)
		}
		a.syncMu.Lock()
		j.running = false
		if err != nil && !errors.Is(err, context.Canceled) {
			j.p.Err = err.Error()
		}
		p := j.progress()
		switch {
		case kind == "resync":
			a.lastResync = &p
		case kind != "rebuild":
			a.lastScrub = &p
		case p.Role >= 0:
			a.lastRebuild = &p
		}
		a.syncMu.Unlock()
		if kind == "rebuild" && err == nil {
			a.maybeResync() // a rebuild that ended with regions pending: now they can be
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			a.log.Error("raid: "+kind+" stopped", "err", err)
		}
	})
	return j, nil
}

// running returns the job running now, nil if none: the current job, or the resync a
// stopped scrub was waiting for. The caller holds syncMu.
func (a *Array) running() *syncJob {
	j := a.job
	if j != nil && !j.running && j.after != nil {
		j = j.after
	}
	if j == nil || !j.running {
		return nil
	}
	return j
}

// stopSync cancels the running job without waiting for it (the caller may hold stripe locks
// the job needs). rebuildToo says whether a rebuild is cancelled too, or only a scrub.
func (a *Array) stopSync(rebuildToo bool) {
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	if j := a.running(); j != nil && (rebuildToo || j.kind != "rebuild") {
		j.cancel()
		if j.after != nil {
			j.after.cancel()
		}
	}
}

// stopAllSync stops the background job, waits for it, and refuses new ones (Close). A full
// resync it stops records its position for the next assembly (recordResyncStop).
func (a *Array) stopAllSync() {
	if a.bm != nil {
		a.bm.Stop()
	}
	a.syncMu.Lock()
	a.closing = true
	if a.job != nil {
		a.job.cancel()
		if a.job.after != nil {
			a.job.after.cancel()
		}
	}
	a.syncMu.Unlock()
	a.bgWG.Wait()
	a.recordResyncStop()
}

// maybeRebuild starts a rebuild if a role needs one and a spare (or a resumable rebuilding
// member) is there, and no rebuild is running. A running scrub is cancelled.
func (a *Array) maybeRebuild() {
	if a.readOnly {
		return
	}
	a.sbMu.Lock()
	need := false
	for r := range a.roles.n() {
		m := a.roles.working(r)
		if m != nil && m.rebuilding.Load() || m == nil && len(a.spares) > 0 {
			need = true
		}
	}
	need = need && !a.roles.failed() // a fast path: rebuild asks again as it starts, and its writes pass the gate
	a.sbMu.Unlock()
	if !need {
		return
	}
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	if j := a.job; j != nil && j.running && j.kind == "rebuild" && j.ctx.Err() == nil {
		return // it is running and will finish the job
	}
	// A cancelled rebuild (its member failed) is followed by a new one once it has ended.
	a.startJobLocked("rebuild", -1, false, a.rebuild)
}

// syncThrottle returns how long a sync that has moved done bytes in elapsed should sleep to stay
// within its limit: max while clients are idle, min while they do I/O (busy), as md's
// sync_speed_min/max. It never returns more than a second, so a speed change or a stop is
// noticed quickly.
func syncThrottle(done int64, elapsed time.Duration, min, max int64, busy bool) time.Duration {
	limit := max
	if busy {
		limit = min
	}
	if limit <= 0 {
		return 0
	}
	need := time.Duration(float64(done) / float64(limit) * float64(time.Second))
	return minDur(need-elapsed, time.Second)
}

func minDur(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// throttle is the state of one sync's speed control: a window of bytes moved and client
// requests seen, restarted every two seconds so that an idle spell does not bank speed.
type throttle struct {
	a       *Array
	start   time.Time
	done    int64
	ops     uint64
	slept   time.Duration // total, for tests and logs
	lastLog time.Time
}

func (a *Array) newThrottle() *throttle {
	now := time.Now()
	return &throttle{a: a, start: now, ops: a.clientOps.Load(), lastLog: now}
}

// wait records n more bytes and sleeps as syncThrottle says, or until ctx is done.
func (t *throttle) wait(ctx context.Context, n int64) error {
	t.done += n
	for {
		ops := t.a.clientOps.Load()
		busy := ops != t.ops
		t.ops = ops
		t.a.syncMu.Lock()
		lo, hi := t.a.speedMin, t.a.speedMax
		t.a.syncMu.Unlock()
		el := time.Since(t.start)
		d := syncThrottle(t.done, el, lo, hi, busy)
		if el > 2*time.Second && d <= 0 {
			t.start, t.done = time.Now(), 0
		}
		if d <= 0 {
			return ctx.Err()
		}
		t.slept += d
		tm := time.NewTimer(d)
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-tm.C:
		}
		if d < time.Second {
			return nil
		}
	}
}

// addMismatches counts the stripes bad (whose parity did not match) in j's progress, keeping
// the first maxMismatchAt stripe numbers. It takes syncMu.
func (a *Array) addMismatches(j *syncJob, bad []int64) {
	a.syncMu.Lock()
	for _, s := range bad {
		j.p.Mismatches++
		if len(j.p.MismatchAt) < maxMismatchAt {
			j.p.MismatchAt = append(j.p.MismatchAt, s)
		}
	}
	a.syncMu.Unlock()
}

// setDone publishes a job's position and logs progress every logEvery.
func (a *Array) setDone(j *syncJob, t *throttle, done int64) {
	a.syncMu.Lock()
	j.p.Done = done
	p := j.progress()
	a.syncMu.Unlock()
	if time.Since(t.lastLog) >= logEvery {
		t.lastLog = time.Now()
		a.log.Info("raid: "+j.kind+" progress", "role", p.Role, "percent", fmt.Sprintf("%.1f", 100*float64(p.Done)/float64(p.Total)),
			"MB_per_s", fmt.Sprintf("%.1f", p.BytesPerSec/1e6), "eta", p.ETA.Round(time.Second), "mismatches", p.Mismatches)
	}
}

// rebuild picks the role to rebuild and its member (a rebuilding one resumes at the rebuild
// position; else the first spare takes the first role without a working member, from stripe
// 0) and reconstructs the role's chunks onto it, batch by batch, each under its stripes'
// locks: below the rebuild position the new member is written like any other, at and above it
// it counts as missing.
// A full rebuild serves each batch from the new member as soon as it is written
// (serveRebuilt), and records the position in the superblocks, after syncing the member, every
// checkpointEvery and when it stops (recordRebuilt); a write that reaches a batch served but
// not recorded records it first (recordBefore). A re-add records each piece as it is done.
// When done the member takes the role and the faulty member it replaces is dropped.
func (a *Array) rebuild(ctx context.Context, j *syncJob) error {
	a.sbMu.Lock()
	if a.roles.failed() {
		a.sbMu.Unlock()
		return nil
	}
	role, sp := -1, (*member)(nil)
	for r := range a.roles.n() {
		if m := a.roles.working(r); m != nil && m.rebuilding.Load() {
			role, sp = r, m
			break
		}
	}
	if sp == nil {
		for r := range a.roles.n() {
			if m := a.roles.member(r); (m == nil || m.faulty.Load()) && len(a.spares) > 0 {
				role, sp = r, a.spares[0]
				a.spares = a.spares[1:]
				if m != nil {
					a.faulty = append(a.faulty, m)
				}
				a.roles.setRebuilt(0)
				sp.rebuilding.Store(true)
				a.roles.set(r, sp)
				if a.bm != nil {
					a.bm.Hold(nil) // the spare's bitmap is written whole at the next flush
				}
				a.roles.recount()
				break
			}
		}
		if sp == nil {
			a.sbMu.Unlock()
			return nil
		}
		if err := a.writeSuperblocks(nil); err != nil {
			a.log.Error("raid: recording the rebuild in the superblocks failed", "err", err)
		}
	}
	C := a.layout.ChunkSize()
	total := a.memberData / C
	pos := a.roles.rebuildPos()
	// A re-added member (ReAdd) gets only the regions whose bits are set. The bits are read
	// under each batch's stripe locks, after its dirty heads are written out: every write to
	// those stripes has then set its region's bit, and no bit is cleared while the role is
	// being rebuilt (bitmap.Members.Whole), so a clear bit is a region unchanged since the
	// member left. A later write to a skipped stripe finds it below the position and writes
	// the member too.
	readd := sp.readd.Load() && a.roles.readd.Load() != nil
	a.sbMu.Unlock()

	a.syncMu.Lock()
	j.p.Role, j.p.Done, j.p.Resumed, j.base, j.p.ReAdd = role, pos*C, pos*C, pos*C, readd
	a.syncMu.Unlock()
	a.log.Info("raid: rebuild started", "member", sp.Name(), "role", role, "from", pos*C, "total", a.memberData, "re-add", readd)

	t := a.newThrottle()
	var err error
	if readd {
		// Only the pieces the re-add's map wants, each recorded as it is done.
		err = a.readdResync(ctx, j, sp, role, t)
		pos = a.roles.rebuildPos()
	} else {
		batch := a.syncBatch()
		bufs := make([][]byte, a.layout.Members())
		for i := range bufs {
			bufs[i] = aligned.Make(int(batch * C)) // members read into it: aligned for direct I/O
		}
		lastCk := time.Now()
		for pos < total {
			if err = ctx.Err(); err != nil {
				break
			}
			if time.Since(lastCk) >= checkpointEvery {
				a.recordRebuilt(pos)
				lastCk = time.Now()
			}
			s0, k := pos, min(batch, total-pos)
			a.locks.LockSpan(s0, k)
			err = a.rebuildSpan(sp, role, s0, k, bufs)
			if err == nil {
				pos = s0 + k
				a.roles.serveRebuilt(pos)
			}
			a.locks.UnlockSpan(s0, k)
			if err != nil {
				break
			}
			a.syncMu.Lock()
			j.p.Resynced += k * C
			a.syncMu.Unlock()
			a.setDone(j, t, pos*C)
			if err = t.wait(ctx, k*C); err != nil {
				break
			}
		}
	}
	if pos < total {
		a.recordRebuilt(pos)
		return err
	}
	// Done: the member takes the role once it is durable (bounded: syncSpare).
	if err := a.syncSpare(sp, role); err != nil {
		return err
	}
	a.sbMu.Lock()
	sp.rebuilding.Store(false)
	sp.readd.Store(false)
	a.roles.setRebuilt(total) // synced; the position no longer matters, and no window stays open
	kept := a.faulty[:0]
	for _, m := range a.faulty {
		if m.sb.Role == role {
			a.retired = append(a.retired, m)
		} else {
			kept = append(kept, m)
		}
	}
	a.faulty = kept
	a.roles.recount()
	werr := a.writeSuperblocks(nil)
	a.sbMu.Unlock()
	a.log.Info("raid: rebuild finished; the member is active", "member", sp.Name(), "role", role,
		"seconds", time.Since(j.start).Seconds(), "throttled", t.slept)
	if werr != nil {
		a.log.Error("raid: recording the finished rebuild failed", "err", werr)
	}
	return nil
}

// recordBefore makes a full rebuild's position durable (recordRebuilt) before a write to
// stripes [s0, s0+n) reaches a member, if they reach into the stripes the rebuild serves but
// has not recorded (roleTable.unrecorded). Every path that writes client data or parity to the
// members calls it under the stripes' locks, after it has chosen the members and before the
// first write: the cache's member I/O (cacheBackend.Do: whole-stripe writes and every
// write-out, of cached writes too), trims; the placed paths decline there instead. One atomic
// load when no window is open.
func (a *Array) recordBefore(s0, n int64) {
	if a.roles.unrecorded(s0, n) {
		a.recordRebuilt(s0 + n)
	}
}

// recordRebuilt makes a full rebuild's position durable as far as it serves, or at least up
// to stripe end: it syncs the rebuilding member, then records in the superblocks the position
// it served before the sync (roleTable.synced, recorded). Writers that meet the window at once
// share one record: each waits for recordMu and returns if the record before covers it. A
// sync that fails, or does not return within the member timeout, fails the member (writes
// then go around it). Callers may hold stripe locks
// (the order: stripe locks, recordMu, sbMu), not sbMu.
func (a *Array) recordRebuilt(end int64) {
	a.recordMu.Lock()
	defer a.recordMu.Unlock()
	pos := a.roles.rebuildPos()
	if a.roles.recorded.Load() >= min(end, pos) || a.roles.readd.Load() != nil {
		return
	}
	var sp *member
	role := -1
	for r := range a.roles.n() {
		if m := a.roles.working(r); m != nil && m.rebuilding.Load() {
			sp, role = m, r
		}
	}
	if sp == nil {
		// The rebuilding member failed: it serves nothing, and writes go around it.
		return
	}
	// A writer waits here with its stripes locked: bounded (syncSpare).
	if a.syncSpare(sp, role) != nil {
		return
	}
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	if a.roles.member(role) != sp || !sp.rebuilding.Load() || sp.faulty.Load() {
		return // it failed, or ended, meanwhile: its position is not to be recorded
	}
	a.roles.synced.Store(max(a.roles.synced.Load(), pos))
	if err := a.writeSuperblocks(nil); err != nil {
		a.log.Error("raid: recording the rebuild position failed", "err", err)
	}
}

// rebuildSpan rebuilds role's chunks of stripes [s0, s0+k) onto sp as the XOR of the other
// members' chunks. The caller holds the stripes' locks; the cache's dirty heads for them are
// written out first, so the members hold the stripes' latest data.
func (a *Array) rebuildSpan(sp *member, role int, s0, k int64, bufs [][]byte) error {
	if err := a.writeOutSpan(s0, k); err != nil {
		return err
	}
	C := a.layout.ChunkSize()
	off := a.dataOffset + s0*C
	L := k * C
	shards := make([][]byte, 0, len(bufs))
	errs := make([]error, a.roles.n())
	var wg sync.WaitGroup
	for r := range a.roles.n() {
		if r == role {
			continue
		}
		m := a.roles.usable(r, s0)
		if m == nil {
			return fmt.Errorf("%w: role %d lost during the rebuild of role %d", ErrArrayFailed, r, role)
		}
		b := bufs[len(shards)][:L]
		shards = append(shards, b)
		wg.Go(func() {
			n, err := a.readMember(m, b, off)
			a.ctr.memberRead.Add(uint64(n))
			if err != nil {
				m.readErrs.Add(1)
				errs[r] = memberErr(m, r, "read", off, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Not the cache's whole-stripe parity: role's chunk, data or parity, is the XOR of every
	// other member's, so k stripes are rebuilt in one Encode without mapping their data.
	target := bufs[len(shards)][:L]
	if err := a.coder.Encode(append(shards, target)); err != nil {
		return err
	}
	n, err := a.memberWrite(sp, role, target, off)
	a.ctr.memberWrit.Add(uint64(n))
	if err == errGateShut {
		return err
	}
	if err != nil {
		sp.writeErrs.Add(1)
		merr := memberErr(sp, role, "write", off, err)
		a.fail(sp, merr) // cancels this job (without waiting for it)
		return merr
	}
	return nil
}

// writeOutSpan writes out the cache's dirty heads of stripes [s0, s0+k), whose locks the
// caller holds, so that the members hold the stripes' latest data.
func (a *Array) writeOutSpan(s0, k int64) error {
	if a.cache != nil {
		return a.cache.WriteOutSpanLocked(s0, k)
	}
	return nil
}

// StartScrub starts a background check of every stripe's parity; with repair, stripes whose
// parity does not match get it rewritten from their data. It runs at the sync speed limits,
// stripe batch by stripe batch under their locks (the cache's dirty heads written out first),
// while the array serves. Progress is in Status().Sync, the result in Status().LastScrub.
// It returns ErrBusy while a rebuild or scrub runs and ErrDegraded if a member is missing; a
// scrub started while the resync after an unclean shutdown runs waits for the resync to end
// (Status().Sync shows the scrub meanwhile).
func (a *Array) StartScrub(repair bool) error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if err := a.writable(); err != nil {
		return err
	}
	if a.roles.degraded() {
		return ErrDegraded
	}
	kind := "check"
	if repair {
		kind = "repair"
		if err := a.markDirty(); err != nil {
			return err
		}
	}
	a.syncMu.Lock()
	defer a.syncMu.Unlock()
	_, err := a.startJobLocked(kind, -1, true, func(ctx context.Context, j *syncJob) error { return a.scrub(ctx, j, repair) })
	return err
}

// StopScrub stops a running scrub; Status().LastScrub keeps what it found so far.
func (a *Array) StopScrub() error {
	a.syncMu.Lock()
	j := a.job
	if j == nil || !j.running || j.kind == "rebuild" || j.kind == "resync" {
		a.syncMu.Unlock()
		return ErrNotRunning
	}
	j.cancel()
	a.syncMu.Unlock()
	<-j.done
	return nil
}

func (a *Array) scrub(ctx context.Context, j *syncJob, repair bool) error {
	C := a.layout.ChunkSize()
	total := a.memberData / C
	batch := a.syncBatch()
	n := a.layout.Members()
	bufs := make([][]byte, n+1)
	for i := range bufs {
		bufs[i] = aligned.Make(int(batch * C)) // members read into it: aligned for direct I/O
	}
	t := a.newThrottle()
	for pos := int64(0); pos < total; {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(batch, total-pos)
		a.locks.LockSpan(pos, k)
		bad, err := a.scrubSpan(pos, k, bufs, repair)
		a.locks.UnlockSpan(pos, k)
		if err != nil {
			return err
		}
		a.addMismatches(j, bad)
		pos += k
		a.setDone(j, t, pos*C)
		if err := t.wait(ctx, k*C); err != nil {
			return err
		}
	}
	a.log.Info("raid: scrub finished", "kind", j.kind, "mismatches", j.p.Mismatches)
	return nil
}

// scrubSpan checks stripes [s0, s0+k) (their locks held) and returns those whose parity does
// not match; with repair it rewrites their parity.
func (a *Array) scrubSpan(s0, k int64, bufs [][]byte, repair bool) ([]int64, error) {
	if a.cache != nil {
		for s := s0; s < s0+k; s++ {
			if err := a.cache.WriteOutLocked(s); err != nil {
				return nil, err
			}
		}
	}
	C := a.layout.ChunkSize()
	off := a.dataOffset + s0*C
	n := a.roles.n()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		m := a.roles.usable(r, s0)
		if m == nil {
			return nil, ErrDegraded
		}
		wg.Go(func() {
			rn, err := a.readMember(m, bufs[r][:k*C], off)
			a.ctr.memberRead.Add(uint64(rn))
			if err != nil {
				m.readErrs.Add(1)
				errs[r] = memberErr(m, r, "read", off, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var bad []int64
	D := a.layout.DataMembers()
	shards := make([][]byte, D+1)
	P := bufs[n]
	for i := range k {
		s := s0 + i
		for d := range D {
			r := a.layout.DataMember(s, d)
			shards[d] = bufs[r][i*C : (i+1)*C]
		}
		shards[D] = P[:C]
		// The cache's whole-stripe parity too is one Coder.Encode of the data chunks; only
		// where they lie differs (here each member's buffer, there the request's bytes in order).
		if err := a.coder.Encode(shards); err != nil {
			return nil, err
		}
		pm := a.layout.ParityMember(s)
		if bytes.Equal(P[:C], bufs[pm][i*C:(i+1)*C]) {
			continue
		}
		bad = append(bad, s)
		if repair {
			var jops []journal.Op
			if a.journaled() {
				jops = []journal.Op{{Role: pm, Off: a.dataOffset + s*C, Buf: P[:C]}}
			}
			if err := a.writeIntent(s, 1, jops, func() error { return a.memberIO(pm, P[:C], a.dataOffset+s*C, true, true) }); err != nil {
				return bad, err
			}
		}
	}
	return bad, nil
}

// syncSpare syncs sp, the member being rebuilt (or re-added) into role, bounded by the member
// timeout as a FLUSH's sync is (eachMember): a sync that fails, or does not return in time,
// fails sp, and writes then go around it. Its callers hold stripe locks (a write recording
// the rebuild's position, a re-add's piece) or are the rebuild that Close waits for: a spare
// whose sync hangs must not hold them for ever. It returns the member error.
func (a *Array) syncSpare(sp *member, role int) error {
	err := a.eachMember([]*member{sp}, func(_ int, m *member) error { return syncData(m.Member) })[0]
	if err != nil {
		err = memberErr(sp, role, "sync", -1, err)
		a.fail(sp, err)
	}
	return err
}
