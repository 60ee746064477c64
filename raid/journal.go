package raid

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/stripe"
)

// Write journal sizes (doc.go # Layout, # Crash consistency).
const (
	// DefaultJournalSize is the size of a journal file Create makes when none is given.
	DefaultJournalSize = 64 << 20
	// MinJournalSize is the smallest journal accepted; a layout with large stripes needs
	// more (JournalMinSize).
	MinJournalSize = 1 << 20
	// MaxJournalPath is the longest journal path the superblock records, in bytes.
	MaxJournalPath = 1024

	journalHeaderSize = 4096
	journalRingOffset = 2 * journalHeaderSize // two header slots, then the ring
	journalPage       = 4096                  // records start and end on these boundaries
	// journalVersion is the format written. Version 1 (records without a commit point,
	// jrecV1*) is read: its header is used, its records only recognised, to refuse them.
	journalVersion = 2

	jrecFixed = 88 // fixed part of a record header; descriptors follow
	jdescSize = 24 // one op descriptor
	jrecOps   = 3  // record types (version 1's were 1 and 2: jrecV1Ops, jrecV1Pad)
	jrecPad   = 4
	jopTrim   = 1 // descriptor flag: a trim, no payload

	jrecV1Ops, jrecV1Pad = 1, 2
	jrecV1HdrCRC         = 76 // version 1's header checksum, over the bytes before it

	// jhfResync is the header flag of a journal whose array needs a full resync after any
	// replay: set when SkipCorruptJournal discarded a corrupt journal, cleared by the first
	// checkpoint after the resync has finished (journal.needResync).
	jhfResync = 1
)

var (
	journalMagic = [8]byte{'r', 'a', 'i', 'd', '5', 'd', 'J', 'H'}
	recordMagic  = [8]byte{'r', 'a', 'i', 'd', '5', 'd', 'J', 'R'}
)

// ErrJournal is returned when a write journal is unusable: its header is corrupt, it belongs
// to another array, it is too small, or writing it failed.
var ErrJournal = errors.New("raid: write journal unusable")

// ErrJournalCorrupt is returned by Assemble when the write journal of an array that was not
// shut down cleanly has an unreadable record followed by records written after that record
// had been made durable: the damage is not a write torn by the crash, and replaying only the
// records before it could undo newer writes already on the members. Nothing is replayed or
// written. AssembleOptions.SkipCorruptJournal assembles anyway: it discards the journal and
// resyncs parity from the members' data.
var ErrJournalCorrupt = errors.New("raid: write journal corrupt")

// ErrJournalMissing is returned by Assemble for an array with the journal policy that was
// not shut down cleanly when its journal cannot be found: the journal holds what a replay
// needs, and assembling without it would leave stripes being written at the crash
// inconsistent, with no resync to fix them.
var ErrJournalMissing = errors.New("raid: write journal missing")

// JournalMinSize returns the smallest journal an array of layout l accepts: room for the two
// headers and four of its largest records (a whole stripe written with one descriptor per
// 4 KiB unit), and at least MinJournalSize.
func JournalMinSize(l stripe.Layout) int64 {
	return max(MinJournalSize, journalRingOffset+4*maxRecordSize(l))
}

func maxRecordSize(l stripe.Layout) int64 {
	ops := int64(l.Members()) * (l.ChunkSize() / journalPage)
	return pageUp(jrecFixed+jdescSize*ops) + int64(l.Members())*l.ChunkSize()
}

func pageUp(n int64) int64 { return (n + journalPage - 1) / journalPage * journalPage }

// journalHeader is one of the two header slots at the start of the journal. The valid slot
// with the higher generation is current; a checkpoint writes the other one, so a torn header
// write leaves the previous one readable.
type journalHeader struct {
	ArrayUUID UUID
	Size      int64  // journal bytes used (header slots and ring)
	RingSize  int64  // ring bytes, from journalRingOffset
	Tail      uint64 // logical position (bytes since creation) of the oldest record to replay
	TailSeq   uint64 // the sequence number the record at Tail must carry
	Gen       uint64 // checkpoint generation: slot Gen%2
	Created   time.Time
	Version   uint32 // format read (journalVersion, or 1); encode writes journalVersion
	Flags     uint32 // jhf* (version 2)
}

// Header field offsets.
const (
	jhMagic    = 0
	jhVersion  = 8
	jhHdrSize  = 12
	jhUUID     = 16
	jhSize     = 32
	jhRingOff  = 40
	jhRingSize = 48
	jhTail     = 56
	jhTailSeq  = 64
	jhGen      = 72
	jhCreated  = 80
	jhFlags    = 88
	jhCRC      = journalHeaderSize - 4
)

func (h *journalHeader) encode(b []byte) {
	b = b[:journalHeaderSize]
	clear(b)
	le := binary.LittleEndian
	copy(b[jhMagic:], journalMagic[:])
	le.PutUint32(b[jhVersion:], journalVersion)
	le.PutUint32(b[jhHdrSize:], journalHeaderSize)
	copy(b[jhUUID:], h.ArrayUUID[:])
	le.PutUint64(b[jhSize:], uint64(h.Size))
	le.PutUint64(b[jhRingOff:], journalRingOffset)
	le.PutUint64(b[jhRingSize:], uint64(h.RingSize))
	le.PutUint64(b[jhTail:], h.Tail)
	le.PutUint64(b[jhTailSeq:], h.TailSeq)
	le.PutUint64(b[jhGen:], h.Gen)
	le.PutUint64(b[jhCreated:], uint64(h.Created.UnixNano()))
	le.PutUint32(b[jhFlags:], h.Flags)
	le.PutUint32(b[jhCRC:], crc32.Checksum(b[:jhCRC], crc32c))
}

// decodeJournalHeader parses one header slot; it never panics.
func decodeJournalHeader(b []byte) (*journalHeader, error) {
	if len(b) < journalHeaderSize || [8]byte(b[:8]) != journalMagic {
		return nil, fmt.Errorf("%w: no journal header (magic)", ErrJournal)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[jhCRC:]), crc32.Checksum(b[:jhCRC], crc32c); got != want {
		return nil, fmt.Errorf("%w: header checksum %#08x, computed %#08x", ErrJournal, got, want)
	}
	v := le.Uint32(b[jhVersion:])
	if v != journalVersion && v != 1 || le.Uint32(b[jhHdrSize:]) != journalHeaderSize {
		return nil, fmt.Errorf("%w: header version %d (this build reads %d)", ErrJournal, v, journalVersion)
	}
	h := &journalHeader{
		Size:     int64(le.Uint64(b[jhSize:])),
		RingSize: int64(le.Uint64(b[jhRingSize:])),
		Tail:     le.Uint64(b[jhTail:]),
		TailSeq:  le.Uint64(b[jhTailSeq:]),
		Gen:      le.Uint64(b[jhGen:]),
		Created:  time.Unix(0, int64(le.Uint64(b[jhCreated:]))),
		Version:  v,
	}
	if v >= 2 {
		h.Flags = le.Uint32(b[jhFlags:])
	}
	copy(h.ArrayUUID[:], b[jhUUID:])
	if le.Uint64(b[jhRingOff:]) != journalRingOffset || h.RingSize <= 0 || h.RingSize%journalPage != 0 ||
		h.Size != journalRingOffset+h.RingSize || h.Tail%journalPage != 0 {
		return nil, fmt.Errorf("%w: header geometry: size %d, ring %d, tail %d", ErrJournal, h.Size, h.RingSize, h.Tail)
	}
	return h, nil
}

// journalOwner reports whether m holds a valid journal header, and whose.
func journalOwner(m Member) (UUID, bool) {
	buf := make([]byte, journalRingOffset)
	if m.Size() < journalRingOffset {
		return UUID{}, false
	}
	if _, err := m.ReadAt(buf, 0); err != nil {
		return UUID{}, false
	}
	for slot := range 2 {
		if h, err := decodeJournalHeader(buf[slot*journalHeaderSize:]); err == nil {
			return h.ArrayUUID, true
		}
	}
	return UUID{}, false
}

// readJournalHeader returns the current header of the journal on m: the valid slot with the
// higher generation. It fails if neither slot is valid, or if the journal is another array's
// (uuid) or larger than m.
func readJournalHeader(m Member, uuid UUID) (*journalHeader, error) {
	if m.Size() < journalRingOffset {
		return nil, fmt.Errorf("%w: %s: %d bytes, too small to hold a journal", ErrJournal, m.Name(), m.Size())
	}
	buf := make([]byte, journalRingOffset)
	if _, err := m.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: reading the header: %w", ErrJournal, m.Name(), err)
	}
	var best *journalHeader
	var errs []error
	for slot := range 2 {
		h, err := decodeJournalHeader(buf[slot*journalHeaderSize:])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if h.Gen%2 != uint64(slot) {
			errs = append(errs, fmt.Errorf("%w: generation %d in slot %d", ErrJournal, h.Gen, slot))
			continue
		}
		if best == nil || h.Gen > best.Gen {
			best = h
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%s: %w", m.Name(), errors.Join(errs...))
	}
	if best.ArrayUUID != uuid {
		return nil, fmt.Errorf("%w: %s is the journal of array %s, not of %s", ErrJournal, m.Name(), best.ArrayUUID, uuid)
	}
	if best.Size > m.Size() {
		return nil, fmt.Errorf("%w: %s: the header says %d bytes, the device has %d", ErrJournal, m.Name(), best.Size, m.Size())
	}
	return best, nil
}

// Record header field offsets. A record is a header block — the fixed part, then one
// descriptor per op, zero-padded to whole pages — followed by the payload: the bytes of the
// write ops, one after another, zero-padded to whole pages. bodyCRC covers everything after
// the fixed part (descriptors and payload; for a pad record, just its header block);
// hdrCRC covers the fixed part before it, bodyCRC included.
//
// commit is the group's commit point: every record numbered below it was durable in the
// journal when this record was written (the leader of a group commit sets it, to the first
// sequence number of its group). A valid record whose commit point is above the number of
// an unreadable record proves that the unreadable one had been synced — and so its member
// writes may have been issued — before the crash: it was damaged afterwards, not torn by
// the crash (journal.replay).
const (
	jrMagic   = 0
	jrType    = 8
	jrNops    = 12
	jrSeq     = 16
	jrLSN     = 24
	jrLen     = 32
	jrUUID    = 40
	jrS0      = 56
	jrN       = 64
	jrCommit  = 72
	jrBodyCRC = 80
	jrHdrCRC  = 84
)

// jrecord is a decoded record header.
type jrecord struct {
	typ     uint32
	seq     uint64
	lsn     uint64 // logical position: bytes since the journal was created
	commit  uint64 // every record numbered below was durable when this one was written
	length  int64  // whole record, pages
	hdrLen  int64  // header block, pages
	uuid    UUID
	s0, n   int64 // stripes [s0, s0+n)
	ops     []jop
	bodyCRC uint32
}

// jop is one decoded descriptor: n bytes of payload written at member offset off of role, or
// with trim set n bytes trimmed there.
type jop struct {
	role int
	trim bool
	off  int64
	n    int64
}

// encodeRecord returns the record of stripes [s0, s0+n) and ops in a buffer of its own
// (payload copied), sealed except for its sequence number and position (sealRecord).
func encodeRecord(dst []byte, uuid UUID, s0, n int64, ops []intentOp) []byte {
	hdrLen := pageUp(jrecFixed + jdescSize*int64(len(ops)))
	payload := int64(0)
	for _, op := range ops {
		if op.buf != nil {
			payload += int64(len(op.buf))
		}
	}
	length := hdrLen + pageUp(payload)
	b := dst[:0]
	if int64(cap(b)) < length {
		b = make([]byte, length)
	} else {
		b = b[:length]
		clear(b)
	}
	le := binary.LittleEndian
	copy(b[jrMagic:], recordMagic[:])
	le.PutUint32(b[jrType:], jrecOps)
	le.PutUint32(b[jrNops:], uint32(len(ops)))
	le.PutUint64(b[jrLen:], uint64(length))
	copy(b[jrUUID:], uuid[:])
	le.PutUint64(b[jrS0:], uint64(s0))
	le.PutUint64(b[jrN:], uint64(n))
	p := hdrLen
	for i, op := range ops {
		d := b[jrecFixed+jdescSize*i:]
		le.PutUint32(d[0:], uint32(op.role))
		if op.buf == nil {
			le.PutUint32(d[4:], jopTrim)
			le.PutUint64(d[16:], uint64(op.trim))
		} else {
			le.PutUint64(d[16:], uint64(len(op.buf)))
			p += int64(copy(b[p:], op.buf))
		}
		le.PutUint64(d[8:], uint64(op.off))
	}
	le.PutUint32(b[jrBodyCRC:], crc32.Checksum(b[jrecFixed:], crc32c))
	return b
}

// encodePad returns a pad record: one header block that says the next length bytes (to the
// end of the ring) hold no record.
func encodePad(uuid UUID, length int64) []byte {
	b := make([]byte, journalPage)
	le := binary.LittleEndian
	copy(b[jrMagic:], recordMagic[:])
	le.PutUint32(b[jrType:], jrecPad)
	le.PutUint64(b[jrLen:], uint64(length))
	copy(b[jrUUID:], uuid[:])
	le.PutUint32(b[jrBodyCRC:], crc32.Checksum(b[jrecFixed:], crc32c))
	return b
}

// sealRecord sets the record's sequence number, position and commit point and its header
// checksum.
func sealRecord(b []byte, seq, lsn, commit uint64) {
	le := binary.LittleEndian
	le.PutUint64(b[jrSeq:], seq)
	le.PutUint64(b[jrLSN:], lsn)
	le.PutUint64(b[jrCommit:], commit)
	le.PutUint32(b[jrHdrCRC:], crc32.Checksum(b[:jrHdrCRC], crc32c))
}

// errBadRecord marks the end of the journal's valid records during a replay.
var errBadRecord = errors.New("raid: not a valid journal record")

// decodeRecordHeader parses a record's header block from b, which must hold at least its
// first page, and checks the fixed part's checksum and every field's range (maxLen bounds
// the record's length). If b is shorter than the header block it returns the record with
// ops nil: read hdrLen bytes and call again. It never panics.
func decodeRecordHeader(b []byte, maxLen int64) (*jrecord, error) {
	if len(b) < journalPage || [8]byte(b[:8]) != recordMagic {
		return nil, fmt.Errorf("%w: magic", errBadRecord)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[jrHdrCRC:]), crc32.Checksum(b[:jrHdrCRC], crc32c); got != want {
		return nil, fmt.Errorf("%w: header checksum", errBadRecord)
	}
	r := &jrecord{
		typ: le.Uint32(b[jrType:]), seq: le.Uint64(b[jrSeq:]), lsn: le.Uint64(b[jrLSN:]), commit: le.Uint64(b[jrCommit:]),
		length: int64(le.Uint64(b[jrLen:])), s0: int64(le.Uint64(b[jrS0:])), n: int64(le.Uint64(b[jrN:])),
		bodyCRC: le.Uint32(b[jrBodyCRC:]),
	}
	copy(r.uuid[:], b[jrUUID:])
	nops := int64(le.Uint32(b[jrNops:]))
	if r.length <= 0 || r.length%journalPage != 0 || r.length > maxLen || r.lsn%journalPage != 0 || r.commit > r.seq {
		return nil, fmt.Errorf("%w: length %d at %d", errBadRecord, r.length, r.lsn)
	}
	switch r.typ {
	case jrecPad:
		if nops != 0 {
			return nil, fmt.Errorf("%w: pad with ops", errBadRecord)
		}
		r.hdrLen = journalPage
		return r, nil
	case jrecOps:
	default:
		return nil, fmt.Errorf("%w: type %d", errBadRecord, r.typ)
	}
	r.hdrLen = pageUp(jrecFixed + jdescSize*nops)
	if nops == 0 || r.hdrLen > r.length || r.s0 < 0 || r.n <= 0 || r.s0 > 1<<62-r.n {
		return nil, fmt.Errorf("%w: %d ops, header %d of %d bytes, stripes %d+%d", errBadRecord, nops, r.hdrLen, r.length, r.s0, r.n)
	}
	if int64(len(b)) < r.hdrLen {
		return r, nil
	}
	r.ops = make([]jop, nops)
	payload := int64(0)
	for i := range r.ops {
		d := b[jrecFixed+jdescSize*int64(i):]
		flags := le.Uint32(d[4:])
		op := jop{role: int(le.Uint32(d[0:])), trim: flags == jopTrim, off: int64(le.Uint64(d[8:])), n: int64(le.Uint64(d[16:]))}
		if op.role >= stripe.MaxMembers || flags&^jopTrim != 0 || op.off < 0 || op.n <= 0 || op.n > 1<<40 || op.off > 1<<62-op.n {
			return nil, fmt.Errorf("%w: op %d: role %d, flags %#x, %d bytes at %d", errBadRecord, i, op.role, flags, op.n, op.off)
		}
		if !op.trim {
			payload += op.n
		}
		r.ops[i] = op
	}
	if r.hdrLen+pageUp(payload) != r.length {
		return nil, fmt.Errorf("%w: %d payload bytes in a record of %d", errBadRecord, payload, r.length)
	}
	return r, nil
}

// checkBody checks the record's body checksum; b holds the whole record (its header block
// for a pad record).
func (r *jrecord) checkBody(b []byte) error {
	n := r.length
	if r.typ == jrecPad {
		n = journalPage
	}
	if int64(len(b)) < n {
		return fmt.Errorf("%w: %d of %d bytes", errBadRecord, len(b), n)
	}
	if crc32.Checksum(b[jrecFixed:n], crc32c) != r.bodyCRC {
		return fmt.Errorf("%w: body checksum", errBadRecord)
	}
	return nil
}

// decodeRecord decodes a whole record from b and checks both checksums. It never panics.
func decodeRecord(b []byte) (*jrecord, error) {
	r, err := decodeRecordHeader(b, int64(len(b)))
	if err != nil {
		return nil, err
	}
	if r.typ == jrecOps && r.ops == nil {
		return nil, fmt.Errorf("%w: truncated header", errBadRecord)
	}
	if err := r.checkBody(b); err != nil {
		return nil, err
	}
	return r, nil
}

// JournalStatus describes the write journal (Status.Journal).
type JournalStatus struct {
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

// journal is the write journal of the journal consistency policy: before a stripe operation
// issues any member write, log appends one record with every byte it will write (and every
// trim) to a ring on a separate member and waits until the record is durable. Concurrent
// callers share one write and fdatasync (a group commit). A record's space is reclaimed by a
// checkpoint once its member writes are done and the members synced. After a crash the
// records since the tail are replayed (replay), which completes every stripe operation that
// was logged, atomically: parity matches data again without a resync, whole or degraded.
type journal struct {
	a        *Array
	m        Member // nil: missing (status only)
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
	iov   []unix.Iovec
}

type pendingRec struct {
	lsn, seq uint64
	b        []byte
}

func newJournal(a *Array, m Member, path string, h *journalHeader) *journal {
	j := &journal{
		a: a, m: m, path: path, uuid: h.ArrayUUID, ringSize: h.RingSize, created: h.Created,
		head: h.Tail, tail: h.Tail, seq: h.TailSeq, tailSeq: h.TailSeq, gen: h.Gen, durable: h.TailSeq,
		needResync: h.Flags&jhfResync != 0,
		inflight:   map[uint64]int{}, kick: make(chan struct{}, 1), stop: make(chan struct{}), runDone: make(chan struct{}),
	}
	j.cond.L = &j.mu
	return j
}

// initJournal writes a fresh journal for array uuid on m (every byte of m used) and returns
// its header. The ring is not cleared: records carry the array's UUID and a sequence number,
// so nothing left there can pass for one.
func initJournal(m Member, uuid UUID) (*journalHeader, error) {
	ring := (m.Size() - journalRingOffset) / journalPage * journalPage
	h := &journalHeader{ArrayUUID: uuid, Size: journalRingOffset + ring, RingSize: ring, Tail: 0, TailSeq: 1, Gen: 1,
		Created: time.Now()}
	buf := make([]byte, journalRingOffset)
	h.encode(buf[journalHeaderSize:]) // slot 1 (Gen 1); slot 0 stays zero, invalid
	if _, err := m.WriteAt(buf, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: writing the header: %w", ErrJournal, m.Name(), err)
	}
	if err := m.Sync(); err != nil {
		return nil, fmt.Errorf("%w: %s: syncing the header: %w", ErrJournal, m.Name(), err)
	}
	return h, nil
}

// log makes ops (the member writes of stripes [s0, s0+n)) durable in the journal before they
// are issued; the caller calls done once they have completed. A writer that finds the ring
// full runs (or waits for) a checkpoint itself: that needs only the member writes of records
// already logged to complete, never a stripe lock, so a caller may hold its stripes' locks.
func (j *journal) log(s0, n int64, ops []intentOp) (done func(), err error) {
	bp, _ := j.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	rec := encodeRecord(*bp, j.uuid, s0, n, ops)
	*bp = rec
	defer j.bufs.Put(bp)
	L := uint64(len(rec))
	if int64(L) > j.ringSize/2 {
		return nil, fmt.Errorf("%w: a record of %d bytes does not fit a ring of %d", ErrJournal, L, j.ringSize)
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
		if err := j.checkpoint(); err != nil {
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
			sealRecord(r.b, r.seq, r.lsn, commit)
		}
		werr := j.write(batch)
		j.mu.Lock()
		j.flushing = false
		if werr != nil {
			j.err = fmt.Errorf("%w: %s: %w", ErrJournal, j.m.Name(), werr)
			j.pending = nil // never written: their writers see err
			j.a.log.Error("raid: writing the journal failed; writes fail until the array is reassembled", "journal", j.m.Name(), "err", werr)
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
func (j *journal) write(batch []pendingRec) error {
	ring := uint64(j.ringSize)
	for i := 0; i < len(batch); {
		k := i + 1
		for k < len(batch) && batch[k].lsn%ring != 0 {
			k++
		}
		if err := j.writeRun(batch[i:k], journalRingOffset+int64(batch[i].lsn%ring)); err != nil {
			return err
		}
		i = k
	}
	return j.m.Sync()
}

// writeRun writes records that follow each other at off: one pwritev per maxIov records on a
// file or device (the members' vectored write), else a write each. Only the leader of a group
// writes (j.flushing), so it alone uses j.wbufs and j.iov.
func (j *journal) writeRun(recs []pendingRec, off int64) error {
	for len(recs) > 0 {
		k := min(len(recs), maxIov)
		bufs := j.wbufs[:0]
		for _, r := range recs[:k] {
			bufs = append(bufs, r.b)
		}
		if cap(j.iov) < k {
			j.iov = make([]unix.Iovec, 0, k)
		}
		n, err := writev(j.m, bufs, off, j.iov)
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

// checkpoint reclaims every record logged so far: it waits until their member writes have
// completed, syncs the members, and moves the journal's tail past them, durably.
func (j *journal) checkpoint() error {
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
	clearFlag := j.needResync && !j.a.resyncPending()
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
	if err := j.a.syncMembers(); err != nil {
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
func (j *journal) writeHeader(lsn, seq uint64) error {
	h := &journalHeader{ArrayUUID: j.uuid, Size: journalRingOffset + j.ringSize, RingSize: j.ringSize,
		Tail: lsn, TailSeq: seq, Gen: j.gen + 1, Created: j.created}
	if j.needResync {
		h.Flags |= jhfResync
	}
	buf := make([]byte, journalHeaderSize)
	h.encode(buf)
	off := int64(h.Gen%2) * journalHeaderSize
	if _, err := j.m.WriteAt(buf, off); err != nil {
		return fmt.Errorf("%w: %s: writing the header: %w", ErrJournal, j.m.Name(), err)
	}
	if err := j.m.Sync(); err != nil {
		return fmt.Errorf("%w: %s: syncing the header: %w", ErrJournal, j.m.Name(), err)
	}
	j.gen = h.Gen
	return nil
}

// run is the checkpointer: it checkpoints whenever log finds the ring more than half full,
// so that writers rarely wait for one, until stopRun.
func (j *journal) run() {
	defer close(j.runDone)
	for {
		select {
		case <-j.stop:
			return
		case <-j.kick:
			if err := j.checkpoint(); err != nil {
				j.a.log.Error("raid: journal checkpoint failed", "journal", j.path, "err", err)
			}
		}
	}
}

func (j *journal) stopRun() { j.stopOnce.Do(func() { close(j.stop) }) }

// A replay, and why a damaged record must stop it loudly.
//
// Records are written in sequence-number order, a group at a time (one write, one sync), and
// a record's member writes are issued only once its group is durable. So at a crash the
// journal holds, from its tail: groups that were durable (their member writes done, in
// flight or not yet issued), then perhaps one group that was being written — torn, any of
// its pages missing — none of whose member writes was issued. A replay rewrites every record from the tail, in order, up to the first that is
// not valid: in the torn group that is safe, as no member holds anything newer than the
// records before it.
//
// A record damaged after its group was synced is another matter. Records after it may have
// had their member writes done, over stripes that records before it wrote too; replaying
// those older records and stopping at the damage would put the older data back — flushed
// writes would silently revert. Every record carries its group's commit point (jrCommit:
// every record numbered below was durable when it was written), so a valid record past the
// end whose commit point is above the unreadable record's number proves the unreadable one
// had been synced: the journal is corrupt, and recover refuses (ErrJournalCorrupt) before
// writing anything. Past the end the scan looks at every page (the damaged record's length
// may be unknown); a page counts only if its header checksum, the array's UUID and its
// position (which changes with every lap of the ring) are right, so records of earlier laps
// never count; whole records left past the end of an earlier replay carry numbers, and so
// commit points, below those used since (replay skips ahead), and never count either.
//
// What the journal cannot tell: a record of the last group written, damaged after that
// group was synced, looks like a torn write (no later group vouches for it), and ends the
// replay quietly as a torn record does. See doc.go # Caveats.

// replayRec is a valid record found by scan.
type replayRec struct {
	pos, seq uint64 // logical position and sequence number
	typ      uint32
}

// journalEnd is where a scan found the valid records to end.
type journalEnd struct {
	pos, seq uint64 // the first position, and the number the record there should have
	why      error  // what is there instead
	// later is a valid record past pos whose commit point is above seq, laterPos its
	// position: the record at pos was durable, and is damaged (ErrJournalCorrupt).
	later    *jrecord
	laterPos uint64
	v1       bool   // the record at pos is in the format of journal version 1
	maxSeq   uint64 // the highest sequence number of a valid header past pos
}

// readRecord reads and checks the record that should be at logical position pos with
// sequence number seq, into *buf (grown as needed). why says why it is not valid there (nil:
// valid); err is a read error.
func (j *journal) readRecord(pos, seq uint64, buf *[]byte) (r *jrecord, why, err error) {
	ring := uint64(j.ringSize)
	phys := int64(pos % ring)
	maxLen := min(j.ringSize-phys, j.ringSize/2)
	b := (*buf)[:journalPage]
	if _, err := j.m.ReadAt(b, journalRingOffset+phys); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: reading a record at %d: %w", ErrJournal, j.m.Name(), phys, err)
	}
	r, why = decodeRecordHeader(b, maxLen)
	if why == nil && (r.uuid != j.uuid || r.seq != seq || r.lsn != pos) {
		why = fmt.Errorf("%w: sequence %d at %d, want %d at %d", errBadRecord, r.seq, r.lsn, seq, pos)
	}
	if why != nil {
		return nil, why, nil
	}
	if r.typ == jrecPad {
		return r, r.checkBody(b), nil
	}
	if int64(cap(*buf)) < r.length {
		*buf = append((*buf)[:journalPage], make([]byte, r.length-journalPage)...)
	}
	b = (*buf)[:r.length]
	if _, err := j.m.ReadAt(b[journalPage:], journalRingOffset+phys+journalPage); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: reading a record at %d: %w", ErrJournal, j.m.Name(), phys, err)
	}
	if r, why = decodeRecordHeader(b, maxLen); why == nil {
		why = r.checkBody(b)
	}
	if why != nil {
		return nil, why, nil
	}
	*buf = b
	return r, nil, nil
}

// scan reads the journal from its tail and returns its valid records, in order, and where
// they end; it writes nothing. Past the end it looks for a record that proves the end is
// damage rather than a torn write (journalEnd.later), and for the old format (v1).
func (j *journal) scan() ([]replayRec, journalEnd, error) {
	ring := uint64(j.ringSize)
	pos, seq := j.tail, j.tailSeq
	buf := make([]byte, journalPage)
	var recs []replayRec
	var why error
	for pos-j.tail < ring {
		r, bad, err := j.readRecord(pos, seq, &buf)
		if err != nil {
			return nil, journalEnd{}, err
		}
		if bad != nil {
			why = bad
			break
		}
		recs = append(recs, replayRec{pos, seq, r.typ})
		pos += uint64(r.length)
		seq++
	}
	end := journalEnd{pos: pos, seq: seq, why: why}
	if pos-j.tail >= ring {
		return recs, end, nil
	}
	end.v1 = isV1Record(buf[:journalPage], j.uuid, pos, seq)
	// Every page from the end to the tail's next lap, read a chunk at a time (a chunk never
	// crosses the ring's end).
	chunk := make([]byte, 1<<20)
	for p := pos; p < j.tail+ring; {
		phys := int64(p % ring)
		c := chunk[:min(int64(len(chunk)), j.ringSize-phys, int64(j.tail+ring-p))]
		if _, err := j.m.ReadAt(c, journalRingOffset+phys); err != nil {
			return nil, journalEnd{}, fmt.Errorf("%w: %s: reading at %d: %w", ErrJournal, j.m.Name(), phys, err)
		}
		for off := 0; off < len(c); off, p = off+journalPage, p+journalPage {
			pg := c[off : off+journalPage]
			if [8]byte(pg[:8]) != recordMagic {
				continue
			}
			r, err := decodeRecordHeader(pg, j.ringSize/2)
			if err != nil || r.uuid != j.uuid || r.lsn != p {
				continue
			}
			end.maxSeq = max(end.maxSeq, r.seq)
			if r.commit > seq && end.later == nil {
				end.later, end.laterPos = r, p
			}
		}
	}
	return recs, end, nil
}

// isV1Record reports whether b starts with a valid record header of journal version 1 for
// position pos and sequence number seq: a journal an older raid5d wrote and did not replay.
func isV1Record(b []byte, uuid UUID, pos, seq uint64) bool {
	if len(b) < journalPage || [8]byte(b[:8]) != recordMagic {
		return false
	}
	le := binary.LittleEndian
	typ := le.Uint32(b[jrType:])
	return (typ == jrecV1Ops || typ == jrecV1Pad) &&
		le.Uint32(b[jrecV1HdrCRC:]) == crc32.Checksum(b[:jrecV1HdrCRC], crc32c) &&
		UUID(b[jrUUID:jrUUID+16]) == uuid && le.Uint64(b[jrSeq:]) == seq && le.Uint64(b[jrLSN:]) == pos
}

// recover is the journal's part of assembling a writable array that was not shut down
// cleanly. It scans the journal; if the valid records end in a torn write (the crash), it
// replays them. If the journal is corrupt (a damaged record that later records prove had
// been durable) or in an old format with records to replay, it refuses (ErrJournalCorrupt,
// ErrJournal) without writing anything, unless skipCorrupt is set: then it replays nothing,
// discards the journal's records, and returns resync true — the caller must recompute all
// parity from the members' data (a full resync), as without a journal. resync is true too
// when an earlier discard's resync has not finished (the header's jhfResync).
func (j *journal) recover(skipCorrupt bool) (resync bool, err error) {
	recs, end, err := j.scan()
	if err != nil {
		return false, err
	}
	var bad error
	switch {
	case end.later != nil:
		bad = fmt.Errorf("%w: the record at journal position %d (sequence %d) is unreadable (%v), but the "+
			"record at position %d (sequence %d) was written after it had been synced (its group's commit point is %d): "+
			"the damage is not a write torn by the crash, and replaying the records before it (%d) could undo newer "+
			"writes already on the members; nothing was replayed or written. To assemble anyway, discard the journal "+
			"and recompute parity from the members' data (SkipCorruptJournal, serve --skip-corrupt-journal)",
			ErrJournalCorrupt, end.pos, end.seq, end.why, end.laterPos, end.later.seq, end.later.commit, len(recs))
	case end.v1:
		bad = fmt.Errorf("%w: %s holds records to replay in journal format 1, written by an older raid5d, which this "+
			"build does not read: replay them with the raid5d that wrote them (assemble, then stop it cleanly), or "+
			"discard them and recompute parity from the members' data (SkipCorruptJournal, serve --skip-corrupt-journal)",
			ErrJournal, j.m.Name())
	}
	if bad == nil {
		n, err := j.replay(recs, end)
		if err != nil {
			return false, err
		}
		if skipCorrupt {
			j.a.log.Info("raid: SkipCorruptJournal given, but the write journal is not corrupt: replaying it as usual", "journal", j.path)
		}
		if j.needResync {
			j.a.log.Warn("raid: array was not shut down cleanly; the write journal was replayed, and the full resync that followed a discarded journal had not finished: resyncing again",
				"journal", j.path, "records", n)
		} else {
			j.a.log.Warn("raid: array was not shut down cleanly; the write journal was replayed, parity is consistent",
				"journal", j.path, "records", n)
		}
		return j.needResync, nil
	}
	if !skipCorrupt {
		return false, bad
	}
	j.a.log.Error("raid: DISCARDING the write journal (SkipCorruptJournal): none of its records is replayed; the members' data chunks are "+
		"trusted as they are and all parity is recomputed from them (a full resync). Writes flushed before the crash are on the members "+
		"and kept; writes not yet flushed at the crash may be lost or partly applied; degraded, the stripes being written at the crash "+
		"cannot be resynced (the write hole)",
		"journal", j.path, "why", bad, "valid_records_not_replayed", len(recs))
	// Every record the ring holds has a position below tail+ring, so none can pass the
	// position check from there on; the numbers jump past any seen too.
	pos := j.tail + uint64(j.ringSize)
	seq := max(end.seq, end.maxSeq+1) + uint64(j.ringSize/journalPage) + 1
	j.cpMu.Lock()
	j.needResync = true
	err = j.writeHeader(pos, seq)
	j.cpMu.Unlock()
	if err != nil {
		return false, err
	}
	j.head, j.tail, j.seq, j.tailSeq, j.durable = pos, pos, seq, seq, seq
	return true, nil
}

// replay rewrites, in order, every op of the valid records scan found (recs, ending at end)
// to the member holding its role (a missing or faulty role is skipped: the record's parity
// already accounts for it), syncs the members and empties the journal. It runs at assembly,
// before the array serves. It returns the records replayed.
func (j *journal) replay(recs []replayRec, end journalEnd) (int, error) {
	a := j.a
	buf := make([]byte, journalPage)
	n := 0
	for _, rr := range recs {
		if rr.typ != jrecOps {
			continue
		}
		r, why, err := j.readRecord(rr.pos, rr.seq, &buf)
		if err == nil && why != nil {
			err = fmt.Errorf("%w: %s: the record at %d changed during the replay: %w", ErrJournal, j.m.Name(), rr.pos, why)
		}
		if err != nil {
			return n, err
		}
		if err := j.apply(r, buf); err != nil {
			return n, err
		}
		n++
	}
	a.log.Debug("raid: journal ends", "position", end.pos, "why", end.why)
	if err := a.syncMembers(); err != nil {
		return n, err
	}
	// Records past the end may still be whole (a group that was being written, torn at
	// another record), numbered from end.seq on. Skip more numbers than the ring can hold,
	// so that none of them can ever pass for a record written after this replay.
	pos, seq := end.pos, end.seq+uint64(j.ringSize/journalPage)+1
	j.cpMu.Lock()
	err := j.writeHeader(pos, seq)
	j.cpMu.Unlock()
	if err != nil {
		return n, err
	}
	j.head, j.tail, j.seq, j.tailSeq, j.durable = pos, pos, seq, seq, seq
	j.replayed = n
	return n, nil
}

// apply rewrites one record's ops to the members.
func (j *journal) apply(r *jrecord, b []byte) error {
	a := j.a
	p := r.hdrLen
	for _, op := range r.ops {
		if op.role >= a.roles.n() || op.off < a.dataOffset || op.off+op.n > a.dataOffset+a.memberData {
			return fmt.Errorf("%w: record %d: %d bytes at member offset %d of role %d: outside the data area",
				ErrJournal, r.seq, op.n, op.off, op.role)
		}
		var data []byte
		if !op.trim {
			data = b[p : p+op.n]
			p += op.n
		}
		m := a.roles.working(op.role)
		if m == nil {
			continue
		}
		var err error
		if op.trim {
			err = m.Trim(op.off, op.n)
		} else {
			_, err = m.WriteAt(data, op.off)
		}
		if err != nil {
			return memberErr(m, op.role, "replay journal", op.off, err)
		}
	}
	return nil
}

func (j *journal) status() JournalStatus {
	st := JournalStatus{Path: j.path, Size: j.ringSize, Missing: j.m == nil}
	j.mu.Lock()
	st.Used = int64(j.head - j.tail)
	st.Records, st.Commits, st.Checkpoints, st.FullWaits = j.records, j.commits, j.checkpoints, j.fullWaits
	st.Replayed = j.replayed
	j.mu.Unlock()
	return st
}
