package raid

import (
	"fmt"
	"sync"

	"github.com/raid5d/raid5d/raid/internal/journal"
	memberpkg "github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/stripe"
	"golang.org/x/sys/unix"
)

// cacheBackend is the stripe cache's only way to the members (cache.Backend): every member
// read and write of a write-out, a whole-stripe write or a cache read goes through its Do.
type cacheBackend struct{ a *Array }

// Missing returns the role with no usable member in stripe s, or -1.
func (m cacheBackend) Missing(s int64) int { return m.a.roles.missingAt(s) }

// Do performs ops (offsets in the members' data areas; the caller holds their stripes' locks),
// in four steps: a failed array's writes are refused (ErrArrayFailed); a full rebuild's
// position is recorded if the writes reach stripes it serves but has not recorded
// (recordBefore); the writes' intent is
// made durable — the write-intent bitmap's regions or one journal record, both derived from the
// stripes the ops carry (writeSpan, writeIntent); then do runs the ops, each member's in order,
// every member write through the write gate. A member that fails is failed, its writes skipped
// (the stripe stays consistent without it) and its reads rebuilt from the rest of the stripe.
// Do returns an error only when the array has failed or a stripe has lost two roles
// (ErrArrayFailed), when a read cannot be rebuilt, or when the bitmap or journal fails (then
// nothing is written): the lowest failing role's error.
func (m cacheBackend) Do(ops []stripe.MemberOp) error {
	a := m.a
	if a.roles.failed() {
		// Nothing is written to a failed array, not even data acknowledged before it failed
		// and still dirty in the cache: the surviving members keep what they held at the
		// failure (what a forced reassembly or a recovery tool would work from). The data
		// stays readable in the cache until Close. The write gate makes that hold for a
		// batch already under way; this early refusal only spares the journal a record.
		for i := range ops {
			if ops[i].Write {
				return fmt.Errorf("%w: the stripe cache's write-out of stripe %d refused", ErrArrayFailed, ops[i].Stripe)
			}
		}
	}
	if a.roles.recorded.Load() < a.roles.rebuildPos() { // a rebuild's window may be open
		if s0, n := writeSpan(ops); n > 0 {
			a.recordBefore(s0, n)
		}
	}
	if a.bm != nil || a.jr != nil {
		if s0, n := writeSpan(ops); n > 0 {
			var jops []journal.Op
			if a.journaled() {
				jp := intentOps.Get().(*[]journal.Op)
				defer func() { clear(*jp); *jp = (*jp)[:0]; intentOps.Put(jp) }()
				*jp = a.appendJournalOps(*jp, ops)
				jops = *jp
			}
			return a.writeIntent(s0, n, jops, func() error { return m.do(ops) })
		}
	}
	return m.do(ops)
}

// writeSpan returns the stripes [s0, s0+n) that the writes among ops lie in, from the stripes
// each op carries (MemberOp.Span); n is 0 when there is no write. The write-intent bitmap's
// regions and the journal record's range are derived from it.
func writeSpan(ops []stripe.MemberOp) (s0, n int64) {
	s0, s1 := int64(-1), int64(-1)
	for i := range ops {
		if ops[i].Write {
			a, k := ops[i].Span()
			if s0 < 0 || a < s0 {
				s0 = a
			}
			s1 = max(s1, a+k-1)
		}
	}
	if s0 < 0 {
		return 0, 0
	}
	return s0, s1 - s0 + 1
}

// do runs ops on the members, with no bitmap or journal: a single op in the calling goroutine;
// small batches (up to inlineWriteMax bytes) of writes, and of reads that copy from the
// members' mappings, member after member in the calling goroutine; others with the first
// member's ops here and the rest concurrently on their members' I/O goroutines (runRole). It
// returns the error of the lowest role that failed.
func (m cacheBackend) do(ops []stripe.MemberOp) error {
	a := m.a
	switch {
	case len(ops) == 0:
		return nil
	case len(ops) == 1 && ops[0].Vec == nil:
		op := &ops[0]
		return a.memberIO(op.Role, op.Buf, a.dataOffset+op.Off, op.Write, true)
	}
	var roles, reads uint64  // bitmasks of the roles ops touch, and of those they read
	copies, bytes := true, 0 // copies: every read is one readMemberNow may copy from a mapping
	for i := range ops {
		op := &ops[i]
		roles |= 1 << op.Role
		if !op.Write {
			reads |= 1 << op.Role
			copies = copies && op.Vec == nil && len(op.Buf) <= MappedCopyMax
		}
		bytes += len(op.Buf)
		for _, v := range op.Vec {
			bytes += len(v)
		}
	}
	b := ioBatches.Get().(*ioBatch)
	b.ops = ops
	// Member writes to the page cache are copies, and so are small reads of members mapped
	// into memory (readMemberNow): a small batch of them is a few copies that the calling
	// goroutine does as fast as the member goroutines would, without the hand-offs (a
	// write-out's read-modify-write reads: 8-12% less CPU per random 4 KiB write over /dev/shm
	// members, BenchmarkServedRandWrite4K). A copy that meets a page not in memory waits for
	// the disk in line; the cache's write-outs still run several at a time
	// (cache.Options.WriteBackers). Other reads may wait for a disk, and so does every write
	// to a member opened with O_DIRECT (member doc # Direct I/O) or to a remote one (a round
	// trip each: member.Waits), and large batches gain from running on several cores: those
	// run concurrently, the first role here, the others on their members' goroutines.
	inline := bytes <= inlineWriteMax && !a.anyMember(roles, memberpkg.Waits) &&
		(reads == 0 || copies && a.mapReads && !a.anyMember(reads, unmapped))
	first := -1
	for r := range a.roles.n() {
		switch {
		case roles&(1<<r) == 0:
		case inline:
			a.runRole(b, r)
		case first < 0:
			first = r
		default:
			b.wg.Add(1)
			a.ioq[r] <- ioJob{b: b, role: r}
		}
	}
	if first >= 0 {
		a.runRole(b, first)
		b.wg.Wait()
	}
	var err error
	for _, e := range b.errs {
		if e != nil {
			err = e
			break
		}
	}
	clear(b.errs[:])
	b.ops = nil
	ioBatches.Put(b)
	return err
}

// anyMember reports whether f is true of the member of a role in the bitmask roles
// (memberpkg.Waits: its writes wait for a device or a network, so that a batch's writes are
// worth running concurrently).
func (a *Array) anyMember(roles uint64, f func(memberpkg.Member) bool) bool {
	for r := range a.roles.n() {
		if m := a.roles.member(r); roles&(1<<r) != 0 && m != nil && f(m.Member) {
			return true
		}
	}
	return false
}

// remote reports whether a member of the array (at assembly) is remote (memberpkg.IsWaiter).
func (a *Array) remote() bool { return a.anyMember(1<<a.roles.n()-1, memberpkg.IsWaiter) }

// unmapped reports whether m's bytes cannot be copied from a mapping of it (mapper): small
// reads of it are system calls.
func unmapped(m memberpkg.Member) bool {
	fm, ok := m.(mapper)
	return !ok || fm.Mapping() == nil
}

// runRole runs b's ops for role in order, stopping at the first error.
func (a *Array) runRole(b *ioBatch, role int) {
	for i := range b.ops {
		op := &b.ops[i]
		if op.Role != role {
			continue
		}
		var err error
		if op.Vec != nil {
			if cap(b.iov[role]) < len(op.Vec) {
				b.iov[role] = make([]unix.Iovec, 0, max(len(op.Vec), 64))
			}
			err = a.memberWritev(role, op, b.iov[role])
		} else {
			err = a.memberIO(role, op.Buf, a.dataOffset+op.Off, op.Write, true)
		}
		if err != nil {
			b.errs[role] = err
			return
		}
	}
}

// memberWritev writes op.Vec, each buffer within one chunk, one after another from op.Off of
// role: one pwritev on the member that serves role in all the op's stripes. Where no one
// member does (missing or not yet rebuilt in some of them), or the buffers are more than one
// call takes, it writes them one by one (memberIO). A failed write fails the member, and is an
// error only for a stripe that has lost another role too (skipWrite). The caller holds the
// stripes' locks.
func (a *Array) memberWritev(role int, op *stripe.MemberOp, iov []unix.Iovec) error {
	bufs, off := op.Vec, a.dataOffset+op.Off
	s0, ns := op.Span()
	s1 := s0 + ns - 1
	m := a.roles.usable(role, s0)
	if m == nil || a.roles.usable(role, s1) != m || len(bufs) > maxIov {
		for _, b := range bufs {
			if err := a.memberIO(role, b, off, true, true); err != nil {
				return err
			}
			off += int64(len(b))
		}
		return nil
	}
	if !a.roles.enter(role) {
		return fmt.Errorf("%w (stripes %d-%d, role %d)", errGateShut, s0, s1, role)
	}
	m.begin()
	n, err := writev(m.Member, bufs, off, iov)
	m.end()
	a.roles.leave(role)
	a.ctr.memberWrit.Add(uint64(n))
	if err == nil {
		return nil
	}
	m.writeErrs.Add(1)
	merr := memberErr(m, role, "write", off, err)
	a.fail(m, merr)
	for s := s0; s <= s1; s++ {
		if err := a.skipWrite(role, s, merr); err != nil {
			return err
		}
	}
	return nil
}

// ioBatch is the state of one Do call.
type ioBatch struct {
	ops  []stripe.MemberOp
	errs [stripe.MaxMembers]error        // by role
	iov  [stripe.MaxMembers][]unix.Iovec // by role: scratch for vectored writes
	wg   sync.WaitGroup
}

// ioJob asks a member's I/O goroutine to run role's ops of a batch, or a read worker to read
// role's share of a multi-member ReadAt (st).
type ioJob struct {
	b    *ioBatch
	st   *readState
	role int
}

// ioWorkers is the number of goroutines per member that run the cache's member I/O, so that
// several stripes' reads and writes to one member can be in flight at once.
const ioWorkers = 4

// waitWriteBackers is the stripe cache's write-out goroutines (IOOptions.WriteBackers when
// 0), and waitIOWorkers replaces ioWorkers, for an array with a remote member
// (member.IsWaiter): a write-out there is round trips, not copies, and the throughput of
// random writes is the write-outs in flight over their time. Random 4 KiB writes at +5 ms
// per member request (a lab like test/bench/netns.sh's, load 11-15, two runs each; a
// write-out into a clean bitmap region is 3 round trips: the bitmap, the reads, the writes),
// in IOPS, with write-outs 32/64/128/256 and I/O goroutines 32/32/64/128: 3414-4551,
// 4739-5071, 6235-7591, 4974-6752; at +0 no change beyond the noise. Each write-out in
// flight may hold a workspace of D+1 chunks.
const (
	waitWriteBackers = 128
	waitIOWorkers    = 64
)

// readWorkers is the number of read workers per role: goroutines that take the members of a
// ReadAt other than the first (handOff), so that a read across members reaches them
// concurrently without starting a goroutine per member per request.
const readWorkers = 2

// inlineWriteMax is the most bytes of member writes that Do writes in the calling goroutine,
// one member after another, instead of concurrently on the members' I/O goroutines: a full
// stripe of 16 KiB chunks takes 28% less CPU that way when copied, 9% with stable pages
// (BenchmarkFiles seqwrite-48k, against inlineWriteMax 0). A 1 MiB write's member writes
// (1.33 MiB) were no faster concurrently: inline took 0.94× and 0.97× the CPU and 0.92× and
// 1.07× the time, within the noise of a 2-core machine at load 12 (p > 0.48). They stay
// concurrent, for machines with cores to spare.
const inlineWriteMax = 256 << 10

var ioBatches = sync.Pool{New: func() any { return new(ioBatch) }}

// startIO starts the member I/O goroutines: ioWorkers per role (they serve whichever member
// holds the role when the I/O runs), on a.ioq[role], and readWorkers per role read workers,
// on the one queue after them, a.ioq[a.roles.n()] (readQueue).
func (a *Array) startIO() {
	n := a.roles.n()
	a.ioq = make([]chan ioJob, n+1)
	a.ioq[n] = make(chan ioJob)
	for range readWorkers * n {
		a.ioWG.Go(func() {
			for j := range a.ioq[n] {
				j.st.readRole(j.role)
				j.st.wg.Done()
			}
		})
	}
	workers := ioWorkers
	if a.remote() {
		workers = waitIOWorkers
	}
	for r := range n {
		a.ioq[r] = make(chan ioJob)
		for range workers {
			a.ioWG.Go(func() {
				for j := range a.ioq[r] {
					a.runRole(j.b, j.role)
					j.b.wg.Done()
				}
			})
		}
	}
}

// stopIO stops the member I/O goroutines and waits for them. No Do may be running.
func (a *Array) stopIO() {
	for _, q := range a.ioq {
		if q != nil {
			close(q)
		}
	}
	a.ioWG.Wait()
	a.ioq = nil
}

// handOff gives role r's share of the read st to an idle read worker, or to a new goroutine
// when the array has no read workers (read-only: startIO was not called). It reports false,
// leaving the share to the caller, when every read worker is busy: the machine is then busy
// enough that reading it in the calling goroutine costs little concurrency. A read worker
// waits only for stripe locks, and no holder of a stripe lock waits for a read worker, so
// they cannot deadlock with writes or write-outs.
func (a *Array) handOff(st *readState, r int) bool {
	st.wg.Add(1)
	if len(a.ioq) <= a.roles.n() {
		go func() {
			st.readRole(r)
			st.wg.Done()
		}()
		return true
	}
	select {
	case a.ioq[a.roles.n()] <- ioJob{st: st, role: r}:
		return true
	default:
		st.wg.Done()
		return false
	}
}
