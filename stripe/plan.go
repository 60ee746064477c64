package stripe

// Unit states: the planner's input, per UnitSize unit of each data chunk of a stripe.
const (
	UnitUp    = 1 // the unit's current data is in the caller's buffer
	UnitDirty = 2 // the unit is to be written (newer than its member); implies UnitUp
)

// Kind is what a write-out counts as.
type Kind uint8

const (
	KindNone Kind = iota // no unit is dirty: nothing to write
	KindFull             // every unit is dirty (the stripe written whole): parity from the new data alone, no reads
	KindRMW              // some column is read-modify-written
	KindRCW              // every written column is reconstruct-written (or has no parity member): with every unit up to date, no reads
)

var kindNames = [...]string{KindNone: "none", KindFull: "full", KindRMW: "rmw", KindRCW: "rcw"}

func (k Kind) String() string { return kindNames[k] }

// Col is how the parity of one unit column (unit u of every chunk of the stripe) is made.
type Col uint8

const (
	ColClean    Col = iota // no unit of the column is dirty: parity untouched, nothing written
	ColEncode              // parity encoded from every data unit of the column (all up to date once the reads are done)
	ColUpdate              // read-modify-write: the old data of each dirty unit and the old parity are read, the differences folded in
	ColNoParity            // the parity member is missing: the dirty data is written alone
)

// Buf names the caller's buffer that a planned member read fills or a planned write reads.
type Buf uint8

const (
	// BufUnit is the unit itself: a data unit of the caller's stripe (for a write, wherever
	// the caller keeps its current data), or the caller's parity unit when Chunk is ParityChunk.
	BufUnit Buf = iota
	// BufOld is the caller's scratch for the unit's old data (read-modify-write).
	BufOld
)

// Run is one planned member I/O of a stripe: N consecutive units from unit Unit of chunk Chunk
// on member Role, at member data-area offset Plan.Off(run). Chunk is a data index
// (0..DataMembers()-1) or ParityChunk(l).
type Run struct {
	Role  int
	Chunk int
	Unit  int
	N     int
	Buf   Buf
}

// WriteState is the planner's input: a stripe and what the caller holds of it.
type WriteState struct {
	Stripe int64
	// Units holds the state of unit u of data chunk d at d·UnitsPerChunk()+u: UnitUp,
	// UnitDirty, both or neither. A dirty unit is also treated as up to date. Nil means every
	// unit dirty: a stripe written whole, planned without looking at each unit.
	Units []uint8
	// Missing is the role whose member is missing in the stripe, or -1. It is never read or
	// written; its data lives in parity.
	Missing int
	// ParityStale says that the members' parity of the stripe cannot be trusted (a write-out
	// failed half-way, or a resync after a crash has not reached the stripe): parity is then
	// made from the data (reconstruct-write), never by folding a difference into the old one,
	// except in a column whose missing data unit is unknown, where folding is the only way.
	ParityStale bool
}

// Plan is a stripe's write-out, made by PlanWrite: first every Read (concurrently), then each
// column's parity as Cols says, then every Write (concurrently). Runs on one member are in
// ascending order and never overlap; consecutive units of one member and buffer are merged
// into one run. A Plan is reused: PlanWrite truncates its slices and appends to them.
type Plan struct {
	Stripe int64
	Kind   Kind
	Cols   []Col // by unit column
	Reads  []Run
	Writes []Run
	chunk  int64
}

// Off returns the member data-area offset of r's first unit.
func (p *Plan) Off(r Run) int64 { return p.Stripe*p.chunk + int64(r.Unit)*UnitSize }

// UnitsPerChunk is the number of UnitSize units in a chunk.
func (l Layout) UnitsPerChunk() int { return int(l.chunk / UnitSize) }

// ParityChunk is the chunk index of parity in a Run and in a stripe's buffers: after the data.
func ParityChunk(l Layout) int { return l.members - 1 }

// PlanWrite plans the write-out of w's dirty units and their parity into p, which it resets.
// It allocates only if p's slices lack capacity (Cols: UnitsPerChunk(); Reads and Writes: at
// most Members()·UnitsPerChunk() runs each).
//
// The choice, per stripe:
//   - every unit up to date: parity encoded from the data, no reads (KindFull when every unit
//     is dirty, else KindRCW: the rest of the stripe comes from the caller's up-to-date units);
//   - the parity member missing: the dirty data is written alone;
//   - otherwise, with no data member missing and parity trusted: read-modify-write (old data
//     of each dirty unit and old parity) when it reads no more units than reconstruct-write
//     (the units not up to date in the dirty columns), else reconstruct-write. A tie
//     read-modifies-writes (md reconstructs, unless its rmw_level prefers rmw): it touches
//     only the members it writes, the pages it reads are the ones it then writes (hot in the
//     CPU's cache when the members are page-cache files), and the other members stay free
//     for other stripes; one 4 KiB write of a 4-member array took 14% less CPU through the
//     cache than reconstruct-written (raid's BenchmarkServedRandWrite4K);
//   - a data member missing: columns whose missing unit is up to date are reconstruct-written,
//     the others read-modify-written (their missing unit is known only through parity).
func PlanWrite(p *Plan, l Layout, w WriteState) {
	D, upc, s := l.DataMembers(), l.UnitsPerChunk(), w.Stripe
	pm := l.ParityMember(s)
	dm := -1 // data index of the missing member
	if w.Missing >= 0 && w.Missing != pm {
		dm = l.DataIndex(s, w.Missing)
	}
	up := func(d, u int) bool { return w.Units[d*upc+u] != 0 }
	dirty := func(d, u int) bool { return w.Units[d*upc+u]&UnitDirty != 0 }

	p.Stripe, p.chunk, p.Kind = s, l.chunk, KindNone
	p.Reads, p.Writes = p.Reads[:0], p.Writes[:0]
	if cap(p.Cols) < upc {
		p.Cols = make([]Col, upc)
	}
	cols := p.Cols[:upc]
	p.Cols = cols
	if w.Units == nil {
		planWhole(p, l, w)
		return
	}
	nUp, nDirty, rcwReads, rmwReads := 0, 0, 0, 0
	for u := range upc {
		nd, nu := 0, 0
		for d := range D {
			if dirty(d, u) {
				nd++
			}
			if up(d, u) {
				nu++
			}
		}
		nUp += nu
		nDirty += nd
		cols[u] = ColClean
		if nd > 0 {
			cols[u] = ColEncode
			rcwReads += D - nu
			rmwReads += nd + 1
		}
	}
	if nDirty == 0 {
		return
	}
	// With every unit up to date, reconstruct-write reads nothing and always wins.
	rmw := dm < 0 && !w.ParityStale && rmwReads <= rcwReads
	p.Kind = KindRCW
	for u, col := range cols {
		switch {
		case col == ColClean:
		case pm == w.Missing:
			cols[u] = ColNoParity
		case rmw || dm >= 0 && !up(dm, u):
			cols[u] = ColUpdate
			p.Kind = KindRMW
		}
	}
	if nDirty == D*upc {
		p.Kind = KindFull
	}

	if pm != w.Missing {
		// The missing chunk, if any, is never read: in an encoded column it is up to date, in
		// an updated one it is not dirty.
		for d := range D {
			role := l.DataMember(s, d)
			for u, col := range cols {
				switch {
				case col == ColUpdate && dirty(d, u):
					p.Reads = addRun(p.Reads, Run{Role: role, Chunk: d, Unit: u, N: 1, Buf: BufOld})
				case col == ColEncode && !up(d, u):
					p.Reads = addRun(p.Reads, Run{Role: role, Chunk: d, Unit: u, N: 1, Buf: BufUnit})
				}
			}
		}
		for u, col := range cols {
			if col == ColUpdate {
				p.Reads = addRun(p.Reads, Run{Role: pm, Chunk: D, Unit: u, N: 1, Buf: BufUnit})
			}
		}
	}
	for d := range D {
		if d == dm {
			continue
		}
		role := l.DataMember(s, d)
		for u := range upc {
			if dirty(d, u) {
				p.Writes = addRun(p.Writes, Run{Role: role, Chunk: d, Unit: u, N: 1, Buf: BufUnit})
			}
		}
	}
	if pm != w.Missing {
		for u, col := range cols {
			if col != ColClean {
				p.Writes = addRun(p.Writes, Run{Role: pm, Chunk: D, Unit: u, N: 1, Buf: BufUnit})
			}
		}
	}
}

// planWhole is PlanWrite for a stripe written whole (w.Units nil): the plan the unit-by-unit
// path makes of every unit dirty — no reads, every column encoded (or without parity when the
// parity member is missing), each present chunk written in one run.
func planWhole(p *Plan, l Layout, w WriteState) {
	D, upc, s := l.DataMembers(), l.UnitsPerChunk(), w.Stripe
	pm := l.ParityMember(s)
	col := ColEncode
	if pm == w.Missing {
		col = ColNoParity
	}
	for u := range p.Cols {
		p.Cols[u] = col
	}
	p.Kind = KindFull
	for d := range D {
		if r := l.DataMember(s, d); r != w.Missing {
			p.Writes = append(p.Writes, Run{Role: r, Chunk: d, Unit: 0, N: upc, Buf: BufUnit})
		}
	}
	if pm != w.Missing {
		p.Writes = append(p.Writes, Run{Role: pm, Chunk: D, Unit: 0, N: upc, Buf: BufUnit})
	}
}

// addRun appends r to runs, or extends the last run when r continues it: the same member and
// buffer, the next unit.
func addRun(runs []Run, r Run) []Run {
	if n := len(runs); n > 0 {
		l := &runs[n-1]
		if l.Role == r.Role && l.Buf == r.Buf && l.Unit+l.N == r.Unit {
			l.N += r.N
			return runs
		}
	}
	return append(runs, r)
}
