package cache

import (
	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/stripe"
)

// workspace is one write-out's scratch memory.
type workspace struct {
	plan   stripe.Plan
	ops    []stripe.MemberOp
	shards [][]byte
	old    []byte // (D+1)×chunk: old data for read-modify-write, or rebuild scratch
}

// writeOut writes h's dirty units and the matching parity to the members of stripe s, under
// s's lock, as stripe.PlanWrite plans it: the plan's reads into the head's units (its parity
// unit) or the old-data scratch, each column's parity, then the plan's writes. On success the
// dirty units are clean and referenced units are released (and no longer up to date); on
// error they stay dirty, and the head's parity on the members is no longer trusted.
func (c *Cache) writeOut(h *head, s int64) error {
	D := c.nd
	ws := c.getWork()
	defer c.putWork(ws)
	p := &ws.plan
	// Stale parity matters only to a stripe that is not whole in the head.
	stale := h.mustRCW || h.nUp < D*c.upc && c.mustRC != nil && c.mustRC(s)
	units := h.st
	if h.nDirty == len(h.st) {
		units = nil // every unit dirty: planned as a stripe written whole
	}
	stripe.PlanWrite(p, c.layout, stripe.WriteState{Stripe: s, Units: units, Missing: c.backend.Missing(s), ParityStale: stale})
	if len(p.Reads) > 0 {
		ops := c.appendRuns(ws.ops[:0], h, ws, p, p.Reads, false)
		err := c.backend.Do(ops)
		clear(ops)
		ws.ops = ops[:0]
		if err != nil {
			return err
		}
		for _, r := range p.Reads {
			if r.Buf == stripe.BufUnit && r.Chunk < D {
				for u := r.Unit; u < r.Unit+r.N; u++ {
					h.setUp(r.Chunk*c.upc + u)
				}
			}
		}
	}
	for u, col := range p.Cols {
		P := c.parityUnit(h, u)
		switch col {
		case stripe.ColUpdate:
			for d := range D {
				if h.st[d*c.upc+u]&stDirty != 0 {
					if err := c.coder.Update(P, c.oldUnit(ws, d, u), c.src(h, d, u)); err != nil {
						return err
					}
				}
			}
		case stripe.ColEncode:
			for d := range D {
				ws.shards[d] = c.src(h, d, u)
			}
			ws.shards[D] = P
			if err := c.coder.Encode(ws.shards); err != nil {
				return err
			}
		}
	}
	clear(ws.shards)
	ops := c.appendRuns(ws.ops[:0], h, ws, p, p.Writes, true)
	err := c.backend.Do(ops)
	clear(ops)
	ws.ops = ops[:0]
	if err != nil {
		h.mustRCW = true
		return err
	}
	c.checkWriteOut(h, s) // invariants: the stripe's parity matches its data
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
	c.count(p.Kind)
	return nil
}

// count counts a write-out of one stripe of kind k.
func (c *Cache) count(k stripe.Kind) {
	switch k {
	case stripe.KindFull:
		c.full.Add(1)
	case stripe.KindRMW:
		c.rmw.Add(1)
	case stripe.KindRCW:
		c.rcw.Add(1)
	}
}

// appendRuns appends to ops the member operations of the plan's runs (its reads, or with write
// its writes) on head h and workspace ws, and returns the extended slice. A run's units become
// one operation where their buffers are contiguous in memory (the head's own units of a chunk
// are; units referenced in pinned buffers may not be), several otherwise.
func (c *Cache) appendRuns(ops []stripe.MemberOp, h *head, ws *workspace, p *stripe.Plan, runs []stripe.Run, write bool) []stripe.MemberOp {
	for _, r := range runs {
		off := p.Off(r)
		for u := r.Unit; u < r.Unit+r.N; u++ {
			var b []byte
			switch {
			case r.Buf == stripe.BufOld:
				b = c.oldUnit(ws, r.Chunk, u)
			case r.Chunk == c.nd:
				b = c.parityUnit(h, u)
			case write:
				b = c.src(h, r.Chunk, u)
			default:
				b = c.unit(h, r.Chunk, u)
			}
			ops = extendOp(ops, u > r.Unit, stripe.MemberOp{Role: r.Role, Buf: b, Off: off, Write: write, Stripe: p.Stripe})
			off += stripe.UnitSize
		}
	}
	return ops
}

// extendOp appends op to ops, or, when cont says op continues the last op on its member (the
// next unit of the same planned run), extends the last op if op's buffer follows its buffer in
// memory.
func extendOp(ops []stripe.MemberOp, cont bool, op stripe.MemberOp) []stripe.MemberOp {
	if n := len(ops); cont && n > 0 && contiguous(ops[n-1].Buf, op.Buf) {
		ops[n-1].Buf = ops[n-1].Buf[:len(ops[n-1].Buf)+len(op.Buf)]
		return ops
	}
	return append(ops, op)
}

// contiguous reports whether b starts where a ends, in a's backing array.
func contiguous(a, b []byte) bool {
	return len(b) > 0 && cap(a) >= len(a)+len(b) && &a[:len(a)+1][len(a)] == &b[0]
}

// oldUnit returns the old-data scratch of unit (d, u), with capacity to the end of chunk d.
func (c *Cache) oldUnit(ws *workspace, d, u int) []byte {
	o := int64(d)*c.chunk + int64(u)*stripe.UnitSize
	return ws.old[o : o+stripe.UnitSize : int64(d+1)*c.chunk]
}

func (c *Cache) getWork() *workspace {
	ws := c.work.Get().(*workspace)
	if ws.old == nil {
		ws.old = aligned.Make((c.nd + 1) * int(c.chunk)) // read into by members: aligned for direct I/O
		// Room for a plan's usual runs; a scattered head's grow them once per workspace.
		ws.plan.Cols = make([]stripe.Col, c.upc)
		ws.plan.Reads = make([]stripe.Run, 0, 2*(c.nd+1))
		ws.plan.Writes = make([]stripe.Run, 0, 2*(c.nd+1))
	}
	return ws
}

func (c *Cache) putWork(ws *workspace) {
	clear(ws.shards)
	clear(ws.ops[:cap(ws.ops)])
	ws.ops = ws.ops[:0]
	c.work.Put(ws)
}
