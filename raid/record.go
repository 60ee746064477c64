package raid

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
)

// writeSuperblocks bumps the events counter, brings every working member's superblock up to
// date (role, per-role state table, rebuild checkpoint), applies set (if not nil) and writes
// and syncs them all. Faulty members are not written. The caller holds sbMu.
//
// A member whose superblock cannot be written (an error, or no answer within the member
// timeout) is failed, as md fails a device whose superblock write fails, and the update is
// written again without it: the error comes back only if that leaves the array failed. One
// slow or broken member must not turn every write's markDirty into an error, nor hold sbMu.
func (a *Array) writeSuperblocks(set func(*superblock)) error {
	bad, err := a.superblockWrite(set)
	if len(bad) == 0 {
		return nil
	}
	a.records.begin() // before the members are marked faulty (awaitRecord)
	defer a.records.end()
	rebuilding := false
	for ; len(bad) > 0; bad, err = a.superblockWrite(set) {
		a.log.Error("raid: a superblock update did not reach every member; failing those it missed", "err", err)
		for _, b := range bad {
			if !a.roles.markFaulty(b) {
				rebuilding = rebuilding || b.rebuilding.Load()
				a.log.Error("raid: member marked faulty", "member", b.Name(), "role", a.roles.roleOf(b),
					"why", "its superblock could not be written")
			}
		}
		if a.roles.recount() {
			return fmt.Errorf("%w: writing the superblocks: %w", ErrArrayFailed, err)
		}
	}
	// What fail does after its record, on a goroutine: the caller holds sbMu.
	a.bgWG.Go(func() {
		a.stopSync(rebuilding)
		a.maybeRebuild()
	})
	return nil
}

// superblockWrite is writeSuperblocks, also returning the members whose superblock could not
// be written or synced.
func (a *Array) superblockWrite(set func(*superblock)) (bad []*member, err error) {
	a.events++
	now := time.Now()
	states, rebuilding := a.roles.states()
	recovery := int64(0)
	var readd *readdRecord
	if rebuilding {
		// A re-add's position and map are taken together: its workers move both under the
		// map's lock.
		if rm := a.roles.readd.Load(); rm != nil {
			rm.mu.Lock()
			recovery, readd = a.roles.rebuildPos()*a.layout.ChunkSize(), rm.record()
			gen := rm.gen
			rm.mu.Unlock()
			defer func() {
				if len(bad) == 0 {
					rm.mu.Lock()
					rm.durable = max(rm.durable, gen)
					rm.mu.Unlock()
				}
			}()
		} else {
			// A full rebuild's position as far as its member is synced: the rebuild serves
			// stripes beyond it (roleTable.synced), not yet durable on the member.
			synced := a.roles.synced.Load()
			recovery = synced * a.layout.ChunkSize()
			defer func() {
				if len(bad) == 0 {
					a.roles.recorded.Store(synced)
				}
			}()
		}
	}
	// The bitmap's cleared mark moves only with an update written while every role is
	// active; until one is durable the bitmap clears nothing (bitmapMembers.Whole).
	whole := !a.roles.degraded()
	a.wholeRecorded.Store(false)
	if whole {
		a.eventsCleared = a.events
	}
	defer func() {
		if whole && len(bad) == 0 {
			a.wholeRecorded.Store(true)
		}
	}()
	var ms []*member
	var bufs [][]byte
	var roles []int
	for _, m := range a.all() {
		if m.faulty.Load() {
			continue
		}
		sb := m.sb
		sb.Events, sb.Updated, sb.States, sb.Recovery = a.events, now, states, recovery
		sb.EventsCleared = a.eventsCleared
		sb.ReAdd, sb.Features = readd, sb.Features&^featureReAdd
		if readd != nil {
			sb.Features |= featureReAdd
		}
		sb.Role = a.roles.roleOf(m)
		if set != nil {
			set(sb)
		}
		buf := aligned.Make(SuperblockSize) // aligned for direct I/O; each its own: a hung member's write may outlive this call
		sb.encode(buf)
		ms, bufs, roles = append(ms, m), append(bufs, buf), append(roles, sb.Role)
	}
	// Concurrently, each bounded by the member timeout: sbMu is held meanwhile, and a member
	// that hangs must not hold up a failure, `raid5d fail` or status with it.
	errs := a.eachMember(ms, func(i int, m *member) error {
		if _, err := m.WriteAt(bufs[i], SuperblockOffset); err != nil {
			return memberErr(m, roles[i], "write superblock", SuperblockOffset, err)
		}
		if err := m.Sync(); err != nil {
			return memberErr(m, roles[i], "sync superblock", -1, err)
		}
		return nil
	})
	for i, err := range errs {
		if err != nil {
			if errors.Is(err, ErrMemberHung) {
				errs[i] = memberErr(ms[i], roles[i], "write superblock", SuperblockOffset, err)
			}
			bad = append(bad, ms[i])
		}
	}
	return bad, errors.Join(errs...)
}

// markDirty records in the superblocks, durably, that writes are in flight. Every writing
// method calls it before issuing its first member write.
func (a *Array) markDirty() error {
	if a.dirty.Load() {
		return nil
	}
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	if a.dirty.Load() {
		return nil
	}
	if err := a.writeSuperblocks(func(sb *superblock) { sb.Dirty = true }); err != nil {
		return err
	}
	a.dirty.Store(true)
	return nil
}

// failureRecords counts the member failures being recorded in the superblocks. A record
// begins before its member is marked faulty and ends once it is durable (or has failed the
// array), so whoever sees a member faulty also sees its record under way (Array.awaitRecord).
type failureRecords struct {
	n    atomic.Int32  // records under way
	mu   sync.Mutex    // guards idle and the changes of n
	idle chan struct{} // made when n leaves 0, closed when it comes back to 0
}

// begin counts a record, before its member is marked faulty.
func (f *failureRecords) begin() {
	f.mu.Lock()
	if f.n.Add(1) == 1 {
		f.idle = make(chan struct{})
	}
	f.mu.Unlock()
}

// end ends a record that begin counted.
func (f *failureRecords) end() {
	f.mu.Lock()
	if f.n.Add(-1) == 0 {
		close(f.idle)
	}
	f.mu.Unlock()
}

// wait waits until every record begun before it has ended: one atomic load when none is.
func (f *failureRecords) wait() {
	if f.n.Load() == 0 {
		return
	}
	f.mu.Lock()
	idle := f.idle
	if f.n.Load() == 0 {
		idle = nil
	}
	f.mu.Unlock()
	if idle != nil {
		<-idle
	}
}

// awaitRecord waits until every superblock update recording a faulty member that had begun
// (failureRecords.begin) is durable. Writing methods call it before they return, so that no
// write that skipped a faulty member is acknowledged before the superblocks say the member is
// faulty, and no write that failed with the array returns before the gate has drained
// (roleTable.drain). It does not wait on sbMu: a member is marked faulty before its fail takes
// sbMu, so a waiter could take sbMu first and return before the record.
func (a *Array) awaitRecord() {
	a.records.wait()
	a.roles.drain()
}

// awaitDurable is awaitRecord for a FLUSH or a FUA write that made err of its syncs: the array
// may have failed meanwhile although err is nil, when the syncs skipped members marked faulty
// whose record then failed (their superblocks could not be written: a power cut). What was
// written to them is not durable, and the superblocks do not say so.
func (a *Array) awaitDurable(err error) error {
	a.awaitRecord()
	if err == nil && a.roles.failed() {
		return fmt.Errorf("%w: a member failed during the sync and the failure could not be recorded", ErrArrayFailed)
	}
	return err
}
