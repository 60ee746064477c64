package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/stripe"
)

// Journal sizes (doc.go # Layout).
const (
	// DefaultSize is the size of a journal file the array creates when none is given.
	DefaultSize = 64 << 20
	// MinBytes is the smallest journal accepted; a layout with large stripes needs more
	// (MinSize).
	MinBytes = 1 << 20
	// RingOffset is where the ring starts on the journal device: after two header slots.
	RingOffset = 2 * headerSize

	headerSize = 4096
	page       = 4096 // records start and end on these boundaries
	// version is the format written. Version 1 (records without a commit point,
	// jrecV1*) is read: its header is used, its records only recognised, to refuse them.
	version = 2

	jrecFixed = 88 // fixed part of a record header; descriptors follow
	jdescSize = 24 // one op descriptor
	jrecOps   = 3  // record types (version 1's were 1 and 2: jrecV1Ops, jrecV1Pad)
	jrecPad   = 4
	jopTrim   = 1 // descriptor flag: a trim, no payload

	jrecV1Ops, jrecV1Pad = 1, 2
	jrecV1HdrCRC         = 76 // version 1's header checksum, over the bytes before it

	// jhfResync is the header flag of a journal whose array needs a full resync after any
	// replay: set when SkipCorruptJournal discarded a corrupt journal, cleared by the first
	// checkpoint after the resync has finished (Journal.needResync).
	jhfResync = 1
)

var (
	headerMagic = [8]byte{'r', 'a', 'i', 'd', '5', 'd', 'J', 'H'}
	recordMagic = [8]byte{'r', 'a', 'i', 'd', '5', 'd', 'J', 'R'}
	crc32c      = crc32.MakeTable(crc32.Castagnoli)
)

// UUID is the array's UUID, which every header and record carries.
type UUID = [16]byte

// uuidString formats u as the array does: 8-4-4-4-12 hex digits.
func uuidString(u UUID) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
}

// Store is what reading and writing the journal's header needs of its device; a raid.Member
// is one.
type Store interface {
	Name() string
	Size() int64
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Sync() error
}

// MinSize returns the smallest journal an array of layout l accepts: room for the two
// headers and four of its largest records (a whole stripe written with one descriptor per
// 4 KiB unit), and at least MinBytes.
func MinSize(l stripe.Layout) int64 {
	return max(MinBytes, RingOffset+4*maxRecordSize(l))
}

func maxRecordSize(l stripe.Layout) int64 {
	ops := int64(l.Members()) * (l.ChunkSize() / page)
	return pageUp(jrecFixed+jdescSize*ops) + int64(l.Members())*l.ChunkSize()
}

func pageUp(n int64) int64 { return (n + page - 1) / page * page }

// Header is one of the two header slots at the start of the journal. The valid slot
// with the higher generation is current; a checkpoint writes the other one, so a torn header
// write leaves the previous one readable.
type Header struct {
	ArrayUUID UUID
	Size      int64  // journal bytes used (header slots and ring)
	RingSize  int64  // ring bytes, from RingOffset
	Tail      uint64 // logical position (bytes since creation) of the oldest record to replay
	TailSeq   uint64 // the sequence number the record at Tail must carry
	Gen       uint64 // checkpoint generation: slot Gen%2
	Created   time.Time
	Version   uint32 // format read (version, or 1); encode writes version
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
	jhCRC      = headerSize - 4
)

func (h *Header) encode(b []byte) {
	b = b[:headerSize]
	clear(b)
	le := binary.LittleEndian
	copy(b[jhMagic:], headerMagic[:])
	le.PutUint32(b[jhVersion:], version)
	le.PutUint32(b[jhHdrSize:], headerSize)
	copy(b[jhUUID:], h.ArrayUUID[:])
	le.PutUint64(b[jhSize:], uint64(h.Size))
	le.PutUint64(b[jhRingOff:], RingOffset)
	le.PutUint64(b[jhRingSize:], uint64(h.RingSize))
	le.PutUint64(b[jhTail:], h.Tail)
	le.PutUint64(b[jhTailSeq:], h.TailSeq)
	le.PutUint64(b[jhGen:], h.Gen)
	le.PutUint64(b[jhCreated:], uint64(h.Created.UnixNano()))
	le.PutUint32(b[jhFlags:], h.Flags)
	le.PutUint32(b[jhCRC:], crc32.Checksum(b[:jhCRC], crc32c))
}

// decodeHeader parses one header slot; it never panics.
func decodeHeader(b []byte) (*Header, error) {
	if len(b) < headerSize || [8]byte(b[:8]) != headerMagic {
		return nil, fmt.Errorf("%w: no journal header (magic)", ErrUnusable)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[jhCRC:]), crc32.Checksum(b[:jhCRC], crc32c); got != want {
		return nil, fmt.Errorf("%w: header checksum %#08x, computed %#08x", ErrUnusable, got, want)
	}
	v := le.Uint32(b[jhVersion:])
	if v != version && v != 1 || le.Uint32(b[jhHdrSize:]) != headerSize {
		return nil, fmt.Errorf("%w: header version %d (this build reads %d)", ErrUnusable, v, version)
	}
	h := &Header{
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
	if le.Uint64(b[jhRingOff:]) != RingOffset || h.RingSize <= 0 || h.RingSize%page != 0 ||
		h.Size != RingOffset+h.RingSize || h.Tail%page != 0 {
		return nil, fmt.Errorf("%w: header geometry: size %d, ring %d, tail %d", ErrUnusable, h.Size, h.RingSize, h.Tail)
	}
	return h, nil
}

// Owner reports whether m holds a valid journal header, and whose.
func Owner(m Store) (UUID, bool) {
	buf := aligned.Make(RingOffset) // aligned for direct I/O
	if m.Size() < RingOffset {
		return UUID{}, false
	}
	if _, err := m.ReadAt(buf, 0); err != nil {
		return UUID{}, false
	}
	for slot := range 2 {
		if h, err := decodeHeader(buf[slot*headerSize:]); err == nil {
			return h.ArrayUUID, true
		}
	}
	return UUID{}, false
}

// ReadHeader returns the current header of the journal on m: the valid slot with the
// higher generation. It fails if neither slot is valid, or if the journal is another array's
// (uuid) or larger than m.
func ReadHeader(m Store, uuid UUID) (*Header, error) {
	if m.Size() < RingOffset {
		return nil, fmt.Errorf("%w: %s: %d bytes, too small to hold a journal", ErrUnusable, m.Name(), m.Size())
	}
	buf := aligned.Make(RingOffset) // aligned for direct I/O
	if _, err := m.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: reading the header: %w", ErrUnusable, m.Name(), err)
	}
	var best *Header
	var errs []error
	for slot := range 2 {
		h, err := decodeHeader(buf[slot*headerSize:])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if h.Gen%2 != uint64(slot) {
			errs = append(errs, fmt.Errorf("%w: generation %d in slot %d", ErrUnusable, h.Gen, slot))
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
		return nil, fmt.Errorf("%w: %s is the journal of array %s, not of %s", ErrUnusable, m.Name(), uuidString(best.ArrayUUID), uuidString(uuid))
	}
	if best.Size > m.Size() {
		return nil, fmt.Errorf("%w: %s: the header says %d bytes, the device has %d", ErrUnusable, m.Name(), best.Size, m.Size())
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
// the crash (replay.go).
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

// Record is a decoded record header.
type Record struct {
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

// Seq returns the record's sequence number.
func (r *Record) Seq() uint64 { return r.seq }

// Op is one member write of a stripe operation, as the journal records it: Buf written at the
// absolute member offset Off of role Role, or, with Buf nil, Trim bytes punched there.
type Op struct {
	Role int
	Off  int64
	Buf  []byte
	Trim int64
}

// Len returns the member bytes op covers.
func (op Op) Len() int64 {
	if op.Buf == nil {
		return op.Trim
	}
	return int64(len(op.Buf))
}

// Ops returns the record's ops, their payloads in b (the whole record, as decoded).
func (r *Record) Ops(b []byte) []Op {
	ops := make([]Op, len(r.ops))
	p := r.hdrLen
	for i, d := range r.ops {
		ops[i] = Op{Role: d.role, Off: d.off}
		if d.trim {
			ops[i].Trim = d.n
		} else {
			ops[i].Buf = b[p : p+d.n]
			p += d.n
		}
	}
	return ops
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
// (payload copied), sealed except for its sequence number and position (SealRecord).
func encodeRecord(dst []byte, uuid UUID, s0, n int64, ops []Op) []byte {
	hdrLen := pageUp(jrecFixed + jdescSize*int64(len(ops)))
	payload := int64(0)
	for _, op := range ops {
		if op.Buf != nil {
			payload += int64(len(op.Buf))
		}
	}
	length := hdrLen + pageUp(payload)
	b := dst[:0]
	if int64(cap(b)) < length {
		b = aligned.Make(int(length)) // aligned for direct I/O
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
		le.PutUint32(d[0:], uint32(op.Role))
		if op.Buf == nil {
			le.PutUint32(d[4:], jopTrim)
			le.PutUint64(d[16:], uint64(op.Trim))
		} else {
			le.PutUint64(d[16:], uint64(len(op.Buf)))
			p += int64(copy(b[p:], op.Buf))
		}
		le.PutUint64(d[8:], uint64(op.Off))
	}
	le.PutUint32(b[jrBodyCRC:], crc32.Checksum(b[jrecFixed:], crc32c))
	return b
}

// encodePad returns a pad record: one header block that says the next length bytes (to the
// end of the ring) hold no record.
func encodePad(uuid UUID, length int64) []byte {
	b := aligned.Make(page) // aligned for direct I/O
	le := binary.LittleEndian
	copy(b[jrMagic:], recordMagic[:])
	le.PutUint32(b[jrType:], jrecPad)
	le.PutUint64(b[jrLen:], uint64(length))
	copy(b[jrUUID:], uuid[:])
	le.PutUint32(b[jrBodyCRC:], crc32.Checksum(b[jrecFixed:], crc32c))
	return b
}

// SealRecord sets the record's sequence number, position and commit point and its header
// checksum.
func SealRecord(b []byte, seq, lsn, commit uint64) {
	le := binary.LittleEndian
	le.PutUint64(b[jrSeq:], seq)
	le.PutUint64(b[jrLSN:], lsn)
	le.PutUint64(b[jrCommit:], commit)
	le.PutUint32(b[jrHdrCRC:], crc32.Checksum(b[:jrHdrCRC], crc32c))
}

// decodeRecordHeader parses a record's header block from b, which must hold at least its
// first page, and checks the fixed part's checksum and every field's range (maxLen bounds
// the record's length). If b is shorter than the header block it returns the record with
// ops nil: read hdrLen bytes and call again. It never panics.
func decodeRecordHeader(b []byte, maxLen int64) (*Record, error) {
	if len(b) < page || [8]byte(b[:8]) != recordMagic {
		return nil, fmt.Errorf("%w: magic", errBadRecord)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[jrHdrCRC:]), crc32.Checksum(b[:jrHdrCRC], crc32c); got != want {
		return nil, fmt.Errorf("%w: header checksum", errBadRecord)
	}
	r := &Record{
		typ: le.Uint32(b[jrType:]), seq: le.Uint64(b[jrSeq:]), lsn: le.Uint64(b[jrLSN:]), commit: le.Uint64(b[jrCommit:]),
		length: int64(le.Uint64(b[jrLen:])), s0: int64(le.Uint64(b[jrS0:])), n: int64(le.Uint64(b[jrN:])),
		bodyCRC: le.Uint32(b[jrBodyCRC:]),
	}
	copy(r.uuid[:], b[jrUUID:])
	nops := int64(le.Uint32(b[jrNops:]))
	if r.length <= 0 || r.length%page != 0 || r.length > maxLen || r.lsn%page != 0 || r.commit > r.seq {
		return nil, fmt.Errorf("%w: length %d at %d", errBadRecord, r.length, r.lsn)
	}
	switch r.typ {
	case jrecPad:
		if nops != 0 {
			return nil, fmt.Errorf("%w: pad with ops", errBadRecord)
		}
		r.hdrLen = page
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
func (r *Record) checkBody(b []byte) error {
	n := r.length
	if r.typ == jrecPad {
		n = page
	}
	if int64(len(b)) < n {
		return fmt.Errorf("%w: %d of %d bytes", errBadRecord, len(b), n)
	}
	if crc32.Checksum(b[jrecFixed:n], crc32c) != r.bodyCRC {
		return fmt.Errorf("%w: body checksum", errBadRecord)
	}
	return nil
}

// DecodeRecord decodes a whole record from b and checks both checksums. It never panics.
func DecodeRecord(b []byte) (*Record, error) {
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
