package journal

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/stripe"
)

// Status describes the write journal (raid's Status.Journal).
type Status struct {
	Path        string // where the superblocks (or AssembleOptions) say it is
	Size        int64  // ring bytes
	Used        int64  // ring bytes holding records not yet reclaimed by a checkpoint
	Records     uint64 // records logged since assembly
	Commits     uint64 // journal writes (each one pwrite and fdatasync, shared by the records of a group)
	Checkpoints uint64 // checkpoints: members synced, the journal's tail moved past everything written
	FullWaits   uint64 // writes that found the ring full and waited for a checkpoint
	Replayed    int    // records replayed at assembly
	// Missing: the journal was not found, the array was shut down cleanly, and it was
	// assembled read-only (nothing to replay; writes would not be journaled).
	Missing bool
}

// Array is what the journal needs of the array it protects.
type Array interface {
	// Apply writes op — a record's, during a replay — to the member of op.Role (a trim if
	// op.Buf is nil); with no working member in that role it does nothing (the record's
	// parity already accounts for it). op.Off and the length are within the data area.
	Apply(op Op) error
	// Sync makes every completed member write durable on every working member (a
	// checkpoint's condition for reclaiming records); an error if it could not.
	Sync() error
	// ResyncPending reports whether any region still waits for the resync that follows a
	// discarded journal.
	ResyncPending() bool
}

// Device is the journal's own device: a Store that can also write buffers that follow each
// other at once (WriteVec: one pwritev on a file) and be closed. The Journal owns it.
type Device interface {
	Store
	WriteVec(bufs [][]byte, off int64) (int, error)
	Close() error
}

// Config is the array's geometry and surroundings as the journal needs them.
type Config struct {
	Path string // where the superblocks (or the assembly options) say the journal is
	// Roles, DataStart and DataEnd bound a replayed op: a role below Roles, member bytes
	// in [DataStart, DataEnd).
	Roles              int
	DataStart, DataEnd int64
	Log                *slog.Logger // nil: slog.Default
}

// maxVec is the most records one WriteVec call gets (the kernel's IOV_MAX).
const maxVec = 1024

// Journal is the write journal of the journal consistency policy: before a stripe operation
// issues any member write, Log appends one record with every byte it will write (and every
// trim) to a ring on a separate member and waits until the record is durable. Concurrent
// callers share one write and fdatasync (a group commit). A record's space is reclaimed by a
// checkpoint once its member writes are done and the members synced. After a crash the
// records since the tail are replayed (Recover), which completes every stripe operation that
// was logged, atomically: parity matches data again without a resync, whole or degraded.
type Journal struct {
	arr      Array
	m        Device // nil: missing (status only)
	cfg      Config
	log      *slog.Logger
	path     string
	uuid     UUID
	ringSize int64
	created  time.Time

	// mu guards everything below; cond is signalled (broadcast) whenever durable, err,
	// tail or inflight changes.
	mu                                       sync.Mutex
	cond                                     sync.Cond
	head                                     uint64 // logical position of the next record
	tail                                     uint64 // logical position of the oldest record not reclaimed
	seq                                      uint64 // sequence number of the next record
	tailSeq                                  uint64
	gen                                      uint64 // generation of the current header
	pending                                  []pendingRec
	flushing                                 bool   // a leader is writing a group
	durable                                  uint64 // every record with seq < durable is durable
	err                                      error  // sticky: the journal could not be written
	epoch                                    uint64
	inflight                                 map[uint64]int // per epoch: records logged whose member writes have not completed
	records, commits, checkpoints, fullWaits uint64
	replayed                                 int

	cpMu sync.Mutex // serialises checkpoints (and header writes); guards needResync
	// needResync: the header says jhfResync (a corrupt journal was discarded and the full
	// resync that followed has not finished). A checkpoint clears it once no resync region
	// is pending.
	needResync bool

	kick     chan struct{} // asks the checkpointer for a checkpoint
	stop     chan struct{} // closed by stopRun
	stopOnce sync.Once
	runDone  chan struct{} // closed when run returns
	bufs     sync.Pool     // *[]byte record buffers

	// The group leader's scratch for writeRun (only the leader writes: flushing).
	wbufs [][]byte
}

type pendingRec struct {
	lsn, seq uint64
	b        []byte
}

// New returns the journal on m (nil: missing, for Status only) whose current header is h,
// protecting arr. Run starts its checkpointer.
func New(arr Array, m Device, h *Header, cfg Config) *Journal {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	j := &Journal{
		arr: arr, m: m, cfg: cfg, log: cfg.Log, path: cfg.Path, uuid: h.ArrayUUID, ringSize: h.RingSize, created: h.Created,
		head: h.Tail, tail: h.Tail, seq: h.TailSeq, tailSeq: h.TailSeq, gen: h.Gen, durable: h.TailSeq,
		needResync: h.Flags&jhfResync != 0,
		inflight:   map[uint64]int{}, kick: make(chan struct{}, 1), stop: make(chan struct{}), runDone: make(chan struct{}),
	}
	j.cond.L = &j.mu
	return j
}

// Init writes a fresh journal for array uuid on m (every byte of m used) and returns
// its header. The ring is not cleared: records carry the array's UUID and a sequence number,
// so nothing left there can pass for one.
func Init(m Store, uuid UUID) (*Header, error) {
	ring := (m.Size() - RingOffset) / page * page
	h := &Header{ArrayUUID: uuid, Size: RingOffset + ring, RingSize: ring, Tail: 0, TailSeq: 1, Gen: 1,
		Created: time.Now()}
	buf := aligned.Make(RingOffset) // aligned for direct I/O
	h.encode(buf[headerSize:])      // slot 1 (Gen 1); slot 0 stays zero, invalid
	if _, err := m.WriteAt(buf, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: writing the header: %w", ErrUnusable, m.Name(), err)
	}
	if err := m.Sync(); err != nil {
		return nil, fmt.Errorf("%w: %s: syncing the header: %w", ErrUnusable, m.Name(), err)
	}
	return h, nil
}

// Log makes ops (the member writes of stripes [s0, s0+n)) durable in the journal before they
// are issued; the caller calls done once they have completed. A writer that finds the ring
// full runs (or waits for) a checkpoint itself: that needs only the member writes of records
// already logged to complete, never a stripe lock, so a caller may hold its stripes' locks.
func (j *Journal) Log(s0, n int64, ops []Op) (done func(), err error) {
	bp, _ := j.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	rec := encodeRecord(*bp, j.uuid, s0, n, ops)
	*bp = rec
	defer j.bufs.Put(bp)
	L := uint64(len(rec))
	if int64(L) > j.ringSize/2 {
		return nil, fmt.Errorf("%w: a record of %d bytes does not fit a ring of %d", ErrUnusable, L, j.ringSize)
	}
	ring := uint64(j.ringSize)
	j.mu.Lock()
	var pad uint64
	for {
		if j.err != nil {
			err := j.err
			j.mu.Unlock()
			return nil, err
		}
		pad = 0
		if phys := j.head % ring; phys+L > ring {
			pad = ring - phys
		}
		if j.head+pad+L-j.tail <= ring {
			break
		}
		j.fullWaits++
		j.mu.Unlock()
		if err := j.Checkpoint(); err != nil {
			return nil, err
		}
		j.mu.Lock()
	}
	if pad > 0 {
		pb := encodePad(j.uuid, int64(pad))
		j.pending = append(j.pending, pendingRec{j.head, j.seq, pb})
		j.seq++
		j.head += pad
	}
	my := j.seq
	j.pending = append(j.pending, pendingRec{j.head, my, rec})
	j.seq++
	j.head += L
	j.records++
	ep := j.epoch
	j.inflight[ep]++
	if j.head-j.tail > ring/2 {
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
	for j.durable <= my && j.err == nil {
		if j.flushing {
			j.cond.Wait()
			continue
		}
		// Lead a group: write every record pending now with one write and one sync. The
		// records are sealed here, with the group's commit point: every record before them
		// is durable (the previous group's sync has returned).
		j.flushing = true
		batch := j.pending
		j.pending = nil
		commit := j.durable
		j.mu.Unlock()
		for _, r := range batch {
			SealRecord(r.b, r.seq, r.lsn, commit)
		}
		werr := j.write(batch)
		j.mu.Lock()
		j.flushing = false
		if werr != nil {
			j.err = fmt.Errorf("%w: %s: %w", ErrUnusable, j.m.Name(), werr)
			j.pending = nil // never written: their writers see err
			j.log.Error("raid: writing the journal failed; writes fail until the array is reassembled", "journal", j.m.Name(), "err", werr)
		} else {
			j.durable = max(j.durable, batch[len(batch)-1].seq+1)
			j.commits++
		}
		j.cond.Broadcast()
	}
	if j.durable <= my {
		err := j.err
		j.inflight[ep]--
		j.cond.Broadcast()
		j.mu.Unlock()
		return nil, err
	}
	j.mu.Unlock()
	return func() {
		j.mu.Lock()
		if j.inflight[ep]--; j.inflight[ep] == 0 {
			j.cond.Broadcast()
		}
		j.mu.Unlock()
	}, nil
}

// write writes a group of records (consecutive in the ring, wrapping at most once) and
// makes them durable.
func (j *Journal) write(batch []pendingRec) error {
	ring := uint64(j.ringSize)
	for i := 0; i < len(batch); {
		k := i + 1
		for k < len(batch) && batch[k].lsn%ring != 0 {
			k++
		}
		if err := j.writeRun(batch[i:k], RingOffset+int64(batch[i].lsn%ring)); err != nil {
			return err
		}
		i = k
	}
	return j.m.Sync()
}

// writeRun writes records that follow each other at off, maxVec at a time (WriteVec). Only the
// leader of a group writes (j.flushing), so it alone uses j.wbufs.
func (j *Journal) writeRun(recs []pendingRec, off int64) error {
	for len(recs) > 0 {
		k := min(len(recs), maxVec)
		bufs := j.wbufs[:0]
		for _, r := range recs[:k] {
			bufs = append(bufs, r.b)
		}
		n, err := j.m.WriteVec(bufs, off)
		clear(bufs)
		j.wbufs = bufs[:0]
		if err != nil {
			return err
		}
		off += int64(n)
		recs = recs[k:]
	}
	return nil
}

// Checkpoint reclaims every record logged so far: it waits until their member writes have
// completed, syncs the members, and moves the journal's tail past them, durably.
func (j *Journal) Checkpoint() error {
	j.cpMu.Lock()
	defer j.cpMu.Unlock()
	j.mu.Lock()
	if j.err != nil {
		err := j.err
		j.mu.Unlock()
		return err
	}
	cp, cpSeq := j.head, j.seq
	// The resync flag goes once the resync has finished: every region dropped from the
	// set has been resynced and its members synced.
	clearFlag := j.needResync && !j.arr.ResyncPending()
	if cp == j.tail && !clearFlag {
		j.mu.Unlock()
		return nil
	}
	old := j.epoch
	j.epoch++
	for j.inflight[old] > 0 {
		j.cond.Wait()
	}
	delete(j.inflight, old)
	j.mu.Unlock()
	if err := j.arr.Sync(); err != nil {
		return err
	}
	if clearFlag {
		j.needResync = false
	}
	if err := j.writeHeader(cp, cpSeq); err != nil {
		if clearFlag {
			j.needResync = true
		}
		j.mu.Lock()
		j.err = err
		j.cond.Broadcast()
		j.mu.Unlock()
		return err
	}
	j.mu.Lock()
	j.tail, j.tailSeq = cp, cpSeq
	j.checkpoints++
	j.cond.Broadcast()
	j.mu.Unlock()
	return nil
}

// writeHeader writes the next header generation, with the tail at lsn (sequence seq) and
// the flags of needResync, into its slot and syncs it. The caller holds cpMu.
func (j *Journal) writeHeader(lsn, seq uint64) error {
	h := &Header{ArrayUUID: j.uuid, Size: RingOffset + j.ringSize, RingSize: j.ringSize,
		Tail: lsn, TailSeq: seq, Gen: j.gen + 1, Created: j.created}
	if j.needResync {
		h.Flags |= jhfResync
	}
	buf := aligned.Make(headerSize) // aligned for direct I/O
	h.encode(buf)
	off := int64(h.Gen%2) * headerSize
	if _, err := j.m.WriteAt(buf, off); err != nil {
		return fmt.Errorf("%w: %s: writing the header: %w", ErrUnusable, j.m.Name(), err)
	}
	if err := j.m.Sync(); err != nil {
		return fmt.Errorf("%w: %s: syncing the header: %w", ErrUnusable, j.m.Name(), err)
	}
	j.gen = h.Gen
	return nil
}

// Run is the checkpointer: it checkpoints whenever Log finds the ring more than half full,
// so that writers rarely wait for one, until Stop.
func (j *Journal) Run() {
	defer close(j.runDone)
	for {
		select {
		case <-j.stop:
			return
		case <-j.kick:
			if err := j.Checkpoint(); err != nil {
				j.log.Error("raid: journal checkpoint failed", "journal", j.path, "err", err)
			}
		}
	}
}

// Stop makes Run return (writers that find the ring full still checkpoint by themselves);
// Stopped is closed once it has.
func (j *Journal) Stop() { j.stopOnce.Do(func() { close(j.stop) }) }

// Stopped returns a channel closed when Run has returned.
func (j *Journal) Stopped() <-chan struct{} { return j.runDone }

// MaxStripes returns how many whole stripes of layout l one record may hold: Log refuses a
// record larger than half the ring.
func (j *Journal) MaxStripes(l stripe.Layout) int64 { return j.ringSize / 2 / maxRecordSize(l) }

// Missing reports whether the journal was not found (it has no device: Status only).
func (j *Journal) Missing() bool { return j.m == nil }

// Path returns where the journal is, as Config.Path gave it.
func (j *Journal) Path() string { return j.path }

// Close closes the journal's device (nil if it has none).
func (j *Journal) Close() error {
	if j.m == nil {
		return nil
	}
	return j.m.Close()
}

// Position returns the journal's head and tail (logical byte positions), the sequence number
// of the next record, and the ring's size.
func (j *Journal) Position() (head, tail, seq uint64, ring int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.head, j.tail, j.seq, j.ringSize
}

// NeedsResync reports whether the journal's header flags a full resync to follow any replay
// (a corrupt journal was discarded and the resync has not finished).
func (j *Journal) NeedsResync() bool {
	j.cpMu.Lock()
	defer j.cpMu.Unlock()
	return j.needResync
}
