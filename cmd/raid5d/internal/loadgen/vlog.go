package loadgen

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// The verify log records what a run wrote, so that after a crash Check can tell what every
// block may hold. It is append-only:
//
//	"R5DVLOG1"                          8 bytes
//	u32 n, LogHeader as n bytes of JSON
//	u32 count, count × u32              CRC-32C of each unit's contents before the run
//	records, 16 bytes each:             u8 kind, u8 0, u16 job, u32 gen (or flush id), u64 block
//
// Record kinds, in the order they happen:
//
//   - intent: the write of gen to block is about to be sent. It reaches the kernel (write(2))
//     before the request does, so even if the generator is killed the log names every value
//     that can be on the device.
//   - ack / ackFUA: the write was acknowledged (with FUA: it is durable).
//   - flushStart / flushDone: a FLUSH was sent / acknowledged. Every ack before the flushStart
//     of a flushDone is durable (the server's flush covers the writes of every connection with
//     CAN_MULTI_CONN, else only of its own connection, i.e. job). After a flushDone the log is
//     fsync'd.
//
// Acks may land in the log a little after the reply arrived, never before: the log can only
// understate what is durable, which makes Check lenient, never wrong. A torn last record (the
// generator killed mid-append) is ignored.
const logMagic = "R5DVLOG1"

const (
	recIntent = 1 + iota
	recAck
	recAckFUA
	recFlushStart
	recFlushDone
)

const recSize = 16

// LogHeader describes the run that wrote a verify log.
type LogHeader struct {
	Seed      uint64 `json:"seed"`
	BlockSize int    `json:"block_size"`
	Unit      int    `json:"unit"`
	Offset    int64  `json:"offset"`
	Size      int64  `json:"size"`
	Jobs      int    `json:"jobs"`
	MultiConn bool   `json:"multi_conn"`
	Target    string `json:"target,omitempty"`
	Started   string `json:"started,omitempty"`
}

// ErrBadLog is returned by ReadLog for a file that is not a verify log or is damaged before its
// last record.
var ErrBadLog = errors.New("loadgen: bad verify log")

// logWriter appends records; safe for concurrent use.
type logWriter struct {
	mu  sync.Mutex // guards f, buf, err
	f   *os.File
	buf []byte
	err error // first write or sync error; every later call returns it
}

// createLog creates path (truncating) and writes the header and baseline, fsync'd.
func createLog(path string, h LogHeader, baseline []uint32) (*logWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(h)
	if err != nil {
		f.Close()
		return nil, err
	}
	b := append([]byte(logMagic), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(js)))
	b = append(b, js...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(baseline)))
	for _, c := range baseline {
		b = binary.LittleEndian.AppendUint32(b, c)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &logWriter{f: f, buf: make([]byte, 0, 64<<10)}, nil
}

func (l *logWriter) appendRec(kind byte, job int, gen uint32, block int64) {
	var r [recSize]byte
	r[0] = kind
	binary.LittleEndian.PutUint16(r[2:4], uint16(job))
	binary.LittleEndian.PutUint32(r[4:8], gen)
	binary.LittleEndian.PutUint64(r[8:16], uint64(block))
	l.buf = append(l.buf, r[:]...)
}

// writeOut hands the buffer to the kernel. Caller holds mu.
func (l *logWriter) writeOut() error {
	if l.err == nil && len(l.buf) > 0 {
		_, l.err = l.f.Write(l.buf)
		l.buf = l.buf[:0]
	}
	return l.err
}

// intent records that gen is about to be written to block; it is in the kernel on return.
func (l *logWriter) intent(job int, block int64, gen uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.appendRec(recIntent, job, gen, block)
	return l.writeOut()
}

// ack records an acknowledged write (buffered).
func (l *logWriter) ack(job int, block int64, gen uint32, fua bool) {
	kind := byte(recAck)
	if fua {
		kind = recAckFUA
	}
	l.mu.Lock()
	l.appendRec(kind, job, gen, block)
	if len(l.buf) >= 60<<10 {
		l.writeOut()
	}
	l.mu.Unlock()
}

// flushStart records that a FLUSH is about to be sent (buffered).
func (l *logWriter) flushStart(job int, id uint32) {
	l.mu.Lock()
	l.appendRec(recFlushStart, job, id, 0)
	l.mu.Unlock()
}

// flushDone records an acknowledged FLUSH and fsyncs the log.
func (l *logWriter) flushDone(job int, id uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.appendRec(recFlushDone, job, id, 0)
	if err := l.writeOut(); err != nil {
		return err
	}
	if err := l.f.Sync(); err != nil && l.err == nil {
		l.err = err
	}
	return l.err
}

// close writes out, fsyncs and closes the log.
func (l *logWriter) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.writeOut()
	if serr := l.f.Sync(); err == nil {
		err = serr
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// LogState is what a verify log says each block may hold.
type LogState struct {
	Header LogHeader
	// Baseline is the CRC-32C of each unit of the region before the run.
	Baseline []uint32
	// Durable[b] is the highest generation of block b known durable (0: none); Max[b] the
	// highest generation ever sent to it (0: never written). Every generation in 1..Max[b]
	// was sent, one at a time.
	Durable, Max []uint32
	// Records is the number of records read; TornBytes the length of an incomplete last
	// record that was ignored.
	Records   int64
	TornBytes int
}

// ReadLog replays a verify log.
func ReadLog(r io.Reader) (*LogState, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var pre [12]byte
	if _, err := io.ReadFull(br, pre[:]); err != nil || string(pre[:8]) != logMagic {
		return nil, fmt.Errorf("%w: no %s header", ErrBadLog, logMagic)
	}
	js := make([]byte, binary.LittleEndian.Uint32(pre[8:]))
	if len(js) > 1<<20 {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrBadLog, len(js))
	}
	if _, err := io.ReadFull(br, js); err != nil {
		return nil, fmt.Errorf("%w: short header: %v", ErrBadLog, err)
	}
	st := &LogState{}
	if err := json.Unmarshal(js, &st.Header); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrBadLog, err)
	}
	h := st.Header
	if h.BlockSize <= 0 || h.Unit <= HeaderSize || h.BlockSize%h.Unit != 0 || h.Size <= 0 || h.Size%int64(h.BlockSize) != 0 || h.Jobs <= 0 {
		return nil, fmt.Errorf("%w: header %+v", ErrBadLog, h)
	}
	var cnt [4]byte
	if _, err := io.ReadFull(br, cnt[:]); err != nil {
		return nil, fmt.Errorf("%w: no baseline: %v", ErrBadLog, err)
	}
	units := h.Size / int64(h.Unit)
	if int64(binary.LittleEndian.Uint32(cnt[:])) != units {
		return nil, fmt.Errorf("%w: baseline of %d units, region has %d", ErrBadLog, binary.LittleEndian.Uint32(cnt[:]), units)
	}
	st.Baseline = make([]uint32, units)
	raw := make([]byte, 4*units)
	if _, err := io.ReadFull(br, raw); err != nil {
		return nil, fmt.Errorf("%w: short baseline: %v", ErrBadLog, err)
	}
	for i := range st.Baseline {
		st.Baseline[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	blocks := h.Size / int64(h.BlockSize)
	st.Durable, st.Max = make([]uint32, blocks), make([]uint32, blocks)

	type ack struct {
		idx   int64
		block int64
		gen   uint32
	}
	pending := make([][]ack, h.Jobs) // per job, acks not yet known durable, in log order
	flushStarts := map[[2]uint32]int64{}
	var rec [recSize]byte
	for idx := int64(0); ; idx++ {
		n, err := io.ReadFull(br, rec[:])
		if err == io.EOF {
			break
		}
		if err == io.ErrUnexpectedEOF {
			st.TornBytes = n
			break
		}
		if err != nil {
			return nil, err
		}
		st.Records++
		kind, job := rec[0], int(binary.LittleEndian.Uint16(rec[2:4]))
		gen := binary.LittleEndian.Uint32(rec[4:8])
		block := int64(binary.LittleEndian.Uint64(rec[8:16]))
		if job >= h.Jobs || (kind <= recAckFUA && (block < 0 || block >= blocks || gen == 0)) {
			return nil, fmt.Errorf("%w: record %d out of range (kind %d job %d block %d gen %d)", ErrBadLog, idx, kind, job, block, gen)
		}
		switch kind {
		case recIntent:
			st.Max[block] = max(st.Max[block], gen)
		case recAck:
			pending[job] = append(pending[job], ack{idx, block, gen})
		case recAckFUA:
			st.Durable[block] = max(st.Durable[block], gen)
		case recFlushStart:
			flushStarts[[2]uint32{uint32(job), gen}] = idx
		case recFlushDone:
			start, ok := flushStarts[[2]uint32{uint32(job), gen}]
			if !ok {
				return nil, fmt.Errorf("%w: record %d: flush %d of job %d done but never started", ErrBadLog, idx, gen, job)
			}
			delete(flushStarts, [2]uint32{uint32(job), gen})
			for j := range pending {
				if j != job && !h.MultiConn {
					continue
				}
				q := pending[j]
				for len(q) > 0 && q[0].idx < start {
					st.Durable[q[0].block] = max(st.Durable[q[0].block], q[0].gen)
					q = q[1:]
				}
				pending[j] = q
			}
		default:
			return nil, fmt.Errorf("%w: record %d has unknown kind %d", ErrBadLog, idx, kind)
		}
	}
	for b, d := range st.Durable {
		if d > st.Max[b] {
			return nil, fmt.Errorf("%w: block %d durable at gen %d but only gen %d was sent", ErrBadLog, b, d, st.Max[b])
		}
	}
	return st, nil
}
