package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/raid5d/raid5d/internal/aligned"
)

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
// had been synced: the journal is corrupt, and Recover refuses (ErrCorrupt) before
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

// scanEnd is where a scan found the valid records to end.
type scanEnd struct {
	pos, seq uint64 // the first position, and the number the record there should have
	why      error  // what is there instead
	// later is a valid record past pos whose commit point is above seq, laterPos its
	// position: the record at pos was durable, and is damaged (ErrCorrupt).
	later    *Record
	laterPos uint64
	v1       bool   // the record at pos is in the format of journal version 1
	maxSeq   uint64 // the highest sequence number of a valid header past pos
}

// readRecord reads and checks the record that should be at logical position pos with
// sequence number seq, into *buf (grown as needed). why says why it is not valid there (nil:
// valid); err is a read error.
func (j *Journal) readRecord(pos, seq uint64, buf *[]byte) (r *Record, why, err error) {
	ring := uint64(j.ringSize)
	phys := int64(pos % ring)
	maxLen := min(j.ringSize-phys, j.ringSize/2)
	b := (*buf)[:page]
	if _, err := j.m.ReadAt(b, RingOffset+phys); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: reading a record at %d: %w", ErrUnusable, j.m.Name(), phys, err)
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
		nb := aligned.Make(int(r.length)) // aligned for direct I/O
		copy(nb, (*buf)[:page])
		*buf = nb
	}
	b = (*buf)[:r.length]
	if _, err := j.m.ReadAt(b[page:], RingOffset+phys+page); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: reading a record at %d: %w", ErrUnusable, j.m.Name(), phys, err)
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
// damage rather than a torn write (end.later), and for the old format (v1).
func (j *Journal) scan() ([]replayRec, scanEnd, error) {
	ring := uint64(j.ringSize)
	pos, seq := j.tail, j.tailSeq
	buf := aligned.Make(page) // aligned for direct I/O
	var recs []replayRec
	var why error
	for pos-j.tail < ring {
		r, bad, err := j.readRecord(pos, seq, &buf)
		if err != nil {
			return nil, scanEnd{}, err
		}
		if bad != nil {
			why = bad
			break
		}
		recs = append(recs, replayRec{pos, seq, r.typ})
		pos += uint64(r.length)
		seq++
	}
	end := scanEnd{pos: pos, seq: seq, why: why}
	if pos-j.tail >= ring {
		return recs, end, nil
	}
	end.v1 = isV1Record(buf[:page], j.uuid, pos, seq)
	// Every page from the end to the tail's next lap, read a chunk at a time (a chunk never
	// crosses the ring's end).
	chunk := aligned.Make(1 << 20) // aligned for direct I/O
	for p := pos; p < j.tail+ring; {
		phys := int64(p % ring)
		c := chunk[:min(int64(len(chunk)), j.ringSize-phys, int64(j.tail+ring-p))]
		if _, err := j.m.ReadAt(c, RingOffset+phys); err != nil {
			return nil, scanEnd{}, fmt.Errorf("%w: %s: reading at %d: %w", ErrUnusable, j.m.Name(), phys, err)
		}
		for off := 0; off < len(c); off, p = off+page, p+page {
			pg := c[off : off+page]
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
	if len(b) < page || [8]byte(b[:8]) != recordMagic {
		return false
	}
	le := binary.LittleEndian
	typ := le.Uint32(b[jrType:])
	return (typ == jrecV1Ops || typ == jrecV1Pad) &&
		le.Uint32(b[jrecV1HdrCRC:]) == crc32.Checksum(b[:jrecV1HdrCRC], crc32c) &&
		UUID(b[jrUUID:jrUUID+16]) == uuid && le.Uint64(b[jrSeq:]) == seq && le.Uint64(b[jrLSN:]) == pos
}

// Recover is the journal's part of assembling a writable array that was not shut down
// cleanly. It scans the journal; if the valid records end in a torn write (the crash), it
// replays them. If the journal is corrupt (a damaged record that later records prove had
// been durable) or in an old format with records to replay, it refuses (ErrCorrupt,
// ErrUnusable) without writing anything, unless skipCorrupt is set: then it replays nothing,
// discards the journal's records, and returns resync true — the caller must recompute all
// parity from the members' data (a full resync), as without a journal. resync is true too
// when an earlier discard's resync has not finished (the header's jhfResync).
func (j *Journal) Recover(skipCorrupt bool) (resync bool, err error) {
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
			ErrCorrupt, end.pos, end.seq, end.why, end.laterPos, end.later.seq, end.later.commit, len(recs))
	case end.v1:
		bad = fmt.Errorf("%w: %s holds records to replay in journal format 1, written by an older raid5d, which this "+
			"build does not read: replay them with the raid5d that wrote them (assemble, then stop it cleanly), or "+
			"discard them and recompute parity from the members' data (SkipCorruptJournal, serve --skip-corrupt-journal)",
			ErrUnusable, j.m.Name())
	}
	if bad == nil {
		n, err := j.replay(recs, end)
		if err != nil {
			return false, err
		}
		if skipCorrupt {
			j.log.Info("raid: SkipCorruptJournal given, but the write journal is not corrupt: replaying it as usual", "journal", j.path)
		}
		if j.needResync {
			j.log.Warn("raid: array was not shut down cleanly; the write journal was replayed, and the full resync that followed a discarded journal had not finished: resyncing again",
				"journal", j.path, "records", n)
		} else {
			j.log.Warn("raid: array was not shut down cleanly; the write journal was replayed, parity is consistent",
				"journal", j.path, "records", n)
		}
		return j.needResync, nil
	}
	if !skipCorrupt {
		return false, bad
	}
	j.log.Error("raid: DISCARDING the write journal (SkipCorruptJournal): none of its records is replayed; the members' data chunks are "+
		"trusted as they are and all parity is recomputed from them (a full resync). Writes flushed before the crash are on the members "+
		"and kept; writes not yet flushed at the crash may be lost or partly applied; degraded, the stripes being written at the crash "+
		"cannot be resynced (the write hole)",
		"journal", j.path, "why", bad, "valid_records_not_replayed", len(recs))
	// Every record the ring holds has a position below tail+ring, so none can pass the
	// position check from there on; the numbers jump past any seen too.
	pos := j.tail + uint64(j.ringSize)
	seq := max(end.seq, end.maxSeq+1) + uint64(j.ringSize/page) + 1
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
func (j *Journal) replay(recs []replayRec, end scanEnd) (int, error) {
	buf := aligned.Make(page) // aligned for direct I/O
	n := 0
	for _, rr := range recs {
		if rr.typ != jrecOps {
			continue
		}
		r, why, err := j.readRecord(rr.pos, rr.seq, &buf)
		if err == nil && why != nil {
			err = fmt.Errorf("%w: %s: the record at %d changed during the replay: %w", ErrUnusable, j.m.Name(), rr.pos, why)
		}
		if err != nil {
			return n, err
		}
		if err := j.apply(r, buf); err != nil {
			return n, err
		}
		n++
	}
	j.log.Debug("raid: journal ends", "position", end.pos, "why", end.why)
	if err := j.arr.Sync(); err != nil {
		return n, err
	}
	// Records past the end may still be whole (a group that was being written, torn at
	// another record), numbered from end.seq on. Skip more numbers than the ring can hold,
	// so that none of them can ever pass for a record written after this replay.
	pos, seq := end.pos, end.seq+uint64(j.ringSize/page)+1
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

// apply rewrites one record's ops to the members (Array.Apply); b holds the record.
func (j *Journal) apply(r *Record, b []byte) error {
	c := j.cfg
	for _, op := range r.Ops(b) {
		if op.Role >= c.Roles || op.Off < c.DataStart || op.Off+op.Len() > c.DataEnd {
			return fmt.Errorf("%w: record %d: %d bytes at member offset %d of role %d: outside the data area",
				ErrUnusable, r.seq, op.Len(), op.Off, op.Role)
		}
		if err := j.arr.Apply(op); err != nil {
			return err
		}
	}
	return nil
}

// Status returns the journal's size, use and counters.
func (j *Journal) Status() Status {
	st := Status{Path: j.path, Size: j.ringSize, Missing: j.m == nil}
	j.mu.Lock()
	st.Used = int64(j.head - j.tail)
	st.Records, st.Commits, st.Checkpoints, st.FullWaits = j.records, j.commits, j.checkpoints, j.fullWaits
	st.Replayed = j.replayed
	j.mu.Unlock()
	return st
}

// Logged reads, writing nothing, the records a replay of the journal on m (whose current
// header is h) would rewrite, and calls fn with the stripes [s0, s0+n) of each: the stripes
// whose member writes may have been under way at a crash. Every other stripe's writes had
// completed and been synced when the checkpoint that reclaimed their records was written.
// all reports a journal that cannot say so: its header asks for a full resync (a discarded
// journal's, not finished), or Recover would refuse it (damaged, or in an old format); then
// any stripe may be inconsistent.
func Logged(m Store, h *Header, fn func(s0, n int64)) (all bool, err error) {
	j := &Journal{m: storeDevice{m}, uuid: h.ArrayUUID, ringSize: h.RingSize, tail: h.Tail, tailSeq: h.TailSeq}
	if h.Flags&jhfResync != 0 {
		return true, nil
	}
	recs, end, err := j.scan()
	if err != nil {
		return false, err
	}
	if end.later != nil || end.v1 {
		return true, nil
	}
	buf := aligned.Make(page) // aligned for direct I/O
	for _, rr := range recs {
		if rr.typ != jrecOps {
			continue
		}
		r, why, err := j.readRecord(rr.pos, rr.seq, &buf)
		if err != nil {
			return false, err
		}
		if why != nil {
			return false, fmt.Errorf("%w: %s: the record at %d changed during the scan: %w", ErrUnusable, m.Name(), rr.pos, why)
		}
		fn(r.s0, r.n)
	}
	return false, nil
}

// storeDevice is a Store as a read-only Device (Logged only reads).
type storeDevice struct{ Store }

func (storeDevice) WriteVec([][]byte, int64) (int, error) { return 0, errReadOnly }
func (storeDevice) Close() error                          { return nil }

var errReadOnly = errors.New("raid: journal opened read-only")
