package cache

import "github.com/raid5d/raid5d/stripe"

// workspace is one write-out's scratch memory.
type workspace struct {
	ops    []stripe.MemberOp
	shards [][]byte
	old    []byte  // (D+1)×chunk: old data for read-modify-write, or rebuild scratch
	cols   []uint8 // per unit column: colDirty, colRMW
}

// Column flags of a write-out.
const (
	colDirty = 1 // some data unit of the column is dirty
	colRMW   = 2 // the column is written by read-modify-write
)

// writeOut writes h's dirty units and the matching parity to the members of stripe s, under
// s's lock. Full heads need no reads. Otherwise it reads what reconstruct-write or
// read-modify-write needs, whichever reads fewer units; a stripe whose missing member holds
// data reconstructs where it can (the missing unit is known) and reads old data and parity
// where it cannot. On success the dirty units are clean and referenced units are released
// (and no longer up to date); on error they stay dirty.
func (c *Cache) writeOut(h *head, s int64) error {
	D, upc := c.nd, c.upc
	miss := c.m.Missing(s)
	pm := c.layout.ParityMember(s)
	dm := -1 // data index of the missing member
	if miss >= 0 && miss != pm {
		dm = c.layout.DataIndex(s, miss)
	}
	base := s * c.chunk
	ws := c.getWork()
	defer c.putWork(ws)
	cols := ws.cols[:upc]
	clear(cols)
	for i, st := range h.st {
		if st&stDirty != 0 {
			cols[i%upc] = colDirty
		}
	}
	colDirty := func(u int) bool { return cols[u]&colDirty != 0 }
	full := h.nUp == D*upc
	rmw := false
	if !full && dm < 0 && !h.mustRCW && (c.mustRC == nil || !c.mustRC(s)) {
		rcwReads, rmwReads := 0, 0
		for u := range upc {
			nd, nu := 0, 0
			for d := range D {
				st := h.st[d*upc+u]
				if st&stDirty != 0 {
					nd++
				}
				if st&stUp != 0 {
					nu++
				}
			}
			if nd > 0 {
				rcwReads += D - nu
				rmwReads += nd + 1
			}
		}
		rmw = rmwReads < rcwReads
	}
	for u := range upc {
		if rmw || dm >= 0 && h.st[dm*upc+u]&stUp == 0 {
			cols[u] |= colRMW
		}
	}
	colRMW := func(u int) bool { return cols[u]&colRMW != 0 }
	anyRMW := false

	ops := ws.ops[:0]
	if miss != pm {
		// Reads.
		for d := range D {
			if d == dm {
				continue
			}
			role := c.layout.DataMember(s, d)
			for u := range upc {
				st := h.st[d*upc+u]
				off := base + int64(u)*stripe.UnitSize
				if !colDirty(u) {
					continue
				}
				if colRMW(u) {
					if st&stDirty != 0 {
						o := int64(d)*c.chunk + int64(u)*stripe.UnitSize
						ops = addOp(ops, stripe.MemberOp{Role: role, Buf: ws.old[o : o+stripe.UnitSize : int64(d+1)*c.chunk], Off: off})
					}
				} else if st&stUp == 0 {
					ops = addOp(ops, stripe.MemberOp{Role: role, Buf: c.unit(h, d, u), Off: off})
				}
			}
		}
		for u := range upc {
			if colDirty(u) && colRMW(u) {
				anyRMW = true
				ops = addOp(ops, stripe.MemberOp{Role: pm, Buf: c.parityUnit(h, u), Off: base + int64(u)*stripe.UnitSize})
			}
		}
		if err := c.m.Do(ops); err != nil {
			ws.ops = ops[:0]
			return err
		}
		// Parity.
		for u := range upc {
			if !colDirty(u) {
				continue
			}
			P := c.parityUnit(h, u)
			if colRMW(u) {
				for d := range D {
					if h.st[d*upc+u]&stDirty != 0 {
						o := int64(d)*c.chunk + int64(u)*stripe.UnitSize
						if err := c.coder.Update(P, ws.old[o:o+stripe.UnitSize], c.src(h, d, u)); err != nil {
							return err
						}
					}
				}
				continue
			}
			for d := range D {
				if h.st[d*upc+u]&stUp == 0 { // read just now
					h.setUp(d*upc + u)
				}
				ws.shards[d] = c.src(h, d, u)
			}
			ws.shards[D] = P
			if err := c.coder.Encode(ws.shards); err != nil {
				return err
			}
		}
		clear(ws.shards)
	}
	// Writes.
	ops = ops[:0]
	for d := range D {
		role := c.layout.DataMember(s, d)
		if role == miss {
			continue
		}
		for u := range upc {
			if h.st[d*upc+u]&stDirty != 0 {
				ops = addOp(ops, stripe.MemberOp{Role: role, Buf: c.src(h, d, u), Off: base + int64(u)*stripe.UnitSize, Write: true})
			}
		}
	}
	if miss != pm {
		for u := range upc {
			if colDirty(u) {
				ops = addOp(ops, stripe.MemberOp{Role: pm, Buf: c.parityUnit(h, u), Off: base + int64(u)*stripe.UnitSize, Write: true})
			}
		}
	}
	err := c.m.Do(ops)
	clear(ops)
	ws.ops = ops[:0]
	if err != nil {
		h.mustRCW = true
		return err
	}
	for i, st := range h.st {
		if st&stDirty == 0 {
			continue
		}
		h.st[i] &^= stDirty
		if h.refs != nil && h.refs[i].pin != nil {
			h.dropRef(i)
			h.st[i] = 0
			h.nUp--
		}
	}
	h.nDirty, h.mustRCW = 0, false
	switch {
	case full:
		c.full.Add(1)
	case anyRMW:
		c.rmw.Add(1)
	default:
		c.rcw.Add(1)
	}
	return nil
}

// addOp appends op to ops, or extends the last op when op continues it on the same member in
// the same direction with contiguous memory.
func addOp(ops []stripe.MemberOp, op stripe.MemberOp) []stripe.MemberOp {
	if n := len(ops); n > 0 {
		l := &ops[n-1]
		if l.Role == op.Role && l.Write == op.Write && l.Off+int64(len(l.Buf)) == op.Off && contiguous(l.Buf, op.Buf) {
			l.Buf = l.Buf[:len(l.Buf)+len(op.Buf)]
			return ops
		}
	}
	return append(ops, op)
}

// contiguous reports whether b starts where a ends, in a's backing array.
func contiguous(a, b []byte) bool {
	return len(b) > 0 && cap(a) >= len(a)+len(b) && &a[:len(a)+1][len(a)] == &b[0]
}

func (c *Cache) getWork() *workspace {
	ws := c.work.Get().(*workspace)
	if ws.old == nil {
		ws.old = make([]byte, int64(c.nd+1)*c.chunk)
		ws.cols = make([]uint8, c.upc)
	}
	return ws
}

func (c *Cache) putWork(ws *workspace) {
	clear(ws.shards)
	clear(ws.ops[:cap(ws.ops)])
	ws.ops = ws.ops[:0]
	c.work.Put(ws)
}
