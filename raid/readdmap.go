package raid

import (
	"sync"
	"sync/atomic"
)

// A re-add's map of where the re-added member is whole, and its record in the superblocks.
//
// When a member is re-added, the write-intent bits set at that moment (taken under every
// stripe's lock, so no write that left the member out is still under way) are the regions it
// may have missed; everywhere else it is whole, and from then on every write there writes it
// too. Those regions (units: a power-of-two number of regions, so that the map fits in the
// superblock) are resynced piece by piece: a piece is a power-of-two run of stripes, aligned,
// resynced under its stripes' locks, the member synced, the map updated and written into the
// superblocks before the locks are released. So the member is served (read, and written with
// the others) exactly where the superblocks say it is whole, and a crash at any moment leaves
// a restart that knows it: it resumes the re-add where it stopped and rebuilds nothing the
// member holds, so a stripe torn by a write in flight at the crash is made whole from the
// member's data, not rebuilt into it from torn parity (TestReAddCrashKeepsResynced,
// TestReAddCrashInPiece). What stays exposed is a stripe of a unit not yet resynced, written
// (without the member) and torn at the crash: a degraded array's write hole, as with any
// rebuild under the bitmap policy; a re-add keeps that window as short as its resync of the
// units it needs.
const (
	// readdMapMax is the room for the units' map in the superblock, in bytes.
	readdMapMax = 2048
	// readdExtra is how many pieces at or above the position (the first piece not resynced)
	// may be resynced: the record lists them. The workers (readdWindow) wait rather than
	// resync beyond it.
	readdExtra = 16
)

// readdRecord is a re-add's record in the superblock (featureReAdd): with Recovery (the
// position: every piece below it that meets a unit of Stale has been resynced), where the
// rebuilding member is whole.
type readdRecord struct {
	Unit  int64   // stripes per unit of Stale, a power of two
	Piece int64   // stripes per piece, a power of two
	Stale []byte  // bit u: unit u must be resynced onto the member
	Done  []int64 // pieces (index: stripe / Piece) at or above the position already resynced
}

// readdMap is the running form of a readdRecord. Its stale units never change; done pieces
// are added (and the position moved) by the re-add's workers, each under its piece's locks.
// I/O reads it without a lock (serves).
type readdMap struct {
	unit, piece, stripes int64
	stale                []byte
	// active: I/O may go by the map. Off until the record is durable (ReAdd writes it before
	// it lets any write reach the member).
	active atomic.Bool
	// extra holds, piece index + 1, the pieces at or above the position resynced; 0 is none.
	extra [readdExtra]atomic.Int64

	mu   sync.Mutex // guards what follows, and the position's moves (roleTable.rebuilt)
	done map[int64]bool
	// Writes to pieces not resynced wait for them (Array.awaitReAdd), so that none reaches a
	// stripe the member is not whole in: want holds the pieces they wait for, which the
	// re-add resyncs first; inflight, the pieces being resynced; ended, that no re-add runs
	// (its resync stopped or finished), so nothing waits. changed is closed and replaced at
	// each change (notify).
	want     map[int64]bool
	inflight map[int64]bool
	ended    bool
	changed  chan struct{}
	// gen counts the changes of the record (pieces resynced); durable is the highest gen a
	// superblock update has written to every member: a piece whose change another worker's
	// update already carried needs no update of its own.
	gen, durable uint64
}

// notify wakes everything waiting for a change of m (the caller holds m.mu).
func (m *readdMap) notify() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// whole reports whether the member is whole in every stripe of piece p, the position at pos
// (the caller holds m.mu).
func (m *readdMap) whole(p, pos int64) bool {
	return (p+1)*m.piece <= pos || m.done[p] || !m.wanted(p)
}

// pick returns the piece the re-add resyncs next, -1 if none is left to start, -2 if it must
// wait for a change (the caller holds m.mu). Pieces writes wait for come first. A piece above
// the position starts only while the record has room for it (readdExtra: the pieces above the
// position resynced or being resynced), the piece at the position always: so the position
// always moves on.
func (m *readdMap) pick(pos int64) int64 {
	n := int64(len(m.inflight))
	if n >= readdWindow {
		return -2
	}
	room := int64(m.ahead())+n < readdExtra
	for p := range m.want {
		if m.whole(p, pos) {
			delete(m.want, p)
			continue
		}
		if !m.inflight[p] && (p*m.piece == pos || room) {
			return p
		}
	}
	for p := m.next(pos / m.piece); p >= 0; p = m.next(p + 1) {
		if m.inflight[p] {
			continue
		}
		if p*m.piece == pos || room {
			return p
		}
		return -2
	}
	if n > 0 {
		return -2
	}
	return -1
}

// newReaddMap returns the map of a re-add whose stale regions (regionStripes stripes each,
// in an array of stripes stripes) are those isSet reports, coarsened to units that fit the
// record, and pieces of at most batch stripes.
func newReaddMap(stripes, regionStripes, batch int64, isSet func(region int64) bool) *readdMap {
	unit := regionStripes
	for (stripes+unit-1)/unit > 8*readdMapMax {
		unit *= 2
	}
	piece := int64(1)
	for piece*2 <= batch {
		piece *= 2
	}
	m := &readdMap{unit: unit, piece: piece, stripes: stripes}
	m.init()
	units := (stripes + unit - 1) / unit
	m.stale = make([]byte, (units+7)/8)
	regions := (stripes + regionStripes - 1) / regionStripes
	for r := range regions {
		if isSet(r) {
			u := r * regionStripes / unit
			m.stale[u/8] |= 1 << (u % 8)
		}
	}
	return m
}

func (m *readdMap) init() {
	m.done, m.want, m.inflight = map[int64]bool{}, map[int64]bool{}, map[int64]bool{}
	m.changed = make(chan struct{})
}

// readdMapOf returns the map a record describes (active), for an array of stripes stripes.
func readdMapOf(rec *readdRecord, stripes int64) *readdMap {
	m := &readdMap{unit: rec.Unit, piece: rec.Piece, stripes: stripes, stale: rec.Stale}
	m.init()
	for i, p := range rec.Done {
		m.done[p] = true
		m.extra[i].Store(p + 1)
	}
	m.active.Store(true)
	return m
}

// record returns m's record (the caller holds m.mu).
func (m *readdMap) record() *readdRecord {
	rec := &readdRecord{Unit: m.unit, Piece: m.piece, Stale: m.stale}
	for i := range m.extra {
		if p := m.extra[i].Load(); p > 0 {
			rec.Done = append(rec.Done, p-1)
		}
	}
	return rec
}

// isStale reports whether stripe s lies in a unit to resync.
func (m *readdMap) isStale(s int64) bool {
	u := s / m.unit
	return m.stale[u/8]&(1<<(u%8)) != 0
}

// serves reports whether the re-added member is whole in stripe s at or above the position:
// outside the units to resync, or in a piece resynced.
func (m *readdMap) serves(s int64) bool {
	if !m.active.Load() {
		return false
	}
	if !m.isStale(s) {
		return true
	}
	p := s/m.piece + 1
	for i := range m.extra {
		if m.extra[i].Load() == p {
			return true
		}
	}
	return false
}

// wanted reports whether piece p meets a unit to resync.
func (m *readdMap) wanted(p int64) bool {
	s0, s1 := p*m.piece, min((p+1)*m.piece, m.stripes)
	for s := s0; s < s1; s = (s/m.unit + 1) * m.unit {
		if m.isStale(s) {
			return true
		}
	}
	return false
}

// next returns the first piece at or after p that meets a unit to resync and is not done,
// or -1 if none. The caller holds m.mu.
func (m *readdMap) next(p int64) int64 {
	pieces := (m.stripes + m.piece - 1) / m.piece
	for ; p < pieces; p++ {
		// Skip whole units that need nothing at once.
		if s := p * m.piece; m.piece < m.unit && !m.isStale(s) {
			p = (s/m.unit+1)*m.unit/m.piece - 1
			continue
		}
		if m.wanted(p) && !m.done[p] {
			return p
		}
	}
	return -1
}

// staleRuns calls fn for each run of stripes of piece p in units to resync.
func (m *readdMap) staleRuns(p int64, fn func(s, n int64) error) error {
	s0, s1 := p*m.piece, min((p+1)*m.piece, m.stripes)
	for s := s0; s < s1; {
		end := min((s/m.unit+1)*m.unit, s1)
		if !m.isStale(s) {
			s = end
			continue
		}
		run := s
		for s = end; s < s1 && m.isStale(s); s = min((s/m.unit+1)*m.unit, s1) {
		}
		if err := fn(run, s-run); err != nil {
			return err
		}
	}
	return nil
}

// resynced marks piece p resynced and returns the position (in stripes: the start of the
// first piece still to resync, or the array's stripes) given the old one, pos: past p if p
// was the piece at the position, else unchanged, with p among the extra pieces. The caller
// holds m.mu and p's stripes' locks, stores the position (roleTable.rebuilt) and only then
// calls prune: a stripe a reader does not find among the extra pieces is then below the
// position it loads after.
func (m *readdMap) resynced(p, pos int64) int64 {
	m.done[p] = true
	m.gen++
	if p*m.piece != pos {
		for i := range m.extra {
			if m.extra[i].Load() == 0 {
				m.extra[i].Store(p + 1)
				return pos
			}
		}
		panic("raid: re-add resynced more pieces ahead of its position than its record holds")
	}
	if n := m.next(p); n >= 0 {
		return n * m.piece
	}
	return m.stripes
}

// prune drops the extra pieces below the position pos (the caller holds m.mu).
func (m *readdMap) prune(pos int64) {
	for i := range m.extra {
		if e := m.extra[i].Load(); e > 0 && (e-1)*m.piece < pos {
			m.extra[i].Store(0)
		}
	}
	for p := range m.done {
		if p*m.piece < pos {
			delete(m.done, p)
		}
	}
}

// ahead returns how many pieces at or above the position are resynced (the caller holds m.mu).
func (m *readdMap) ahead() int {
	n := 0
	for i := range m.extra {
		if m.extra[i].Load() > 0 {
			n++
		}
	}
	return n
}
