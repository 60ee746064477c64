package cache

import "github.com/raid5d/raid5d/stripe"

// maxBatchBytes bounds the data of one batch of whole stripes written together (writeFulls),
// and so the batch's scratch memory: its parity, and its copy of the data without stable pages.
const maxBatchBytes = 1 << 20

// batch is the scratch memory of one writeFulls; pooled (Cache.batches).
type batch struct {
	data   []byte // nBatch stripes of data: the copy of the caller's, without stable pages
	par    []byte // nBatch parity chunks
	ops    []stripe.MemberOp
	vecs   [][]byte // slot r·n+i holds role r's chunk of the batch's whole stripe i, or nil
	lead   [][]byte // a joined head's buffers (leadPieces): at most a piece per unit and parity unit
	leadAt []int    // role r's buffers in lead: [leadAt[2r], leadAt[2r+1])
	flat   [][]byte // the ops' Vec, back to back: per role, lead's pieces and a chunk per stripe
	shards [][]byte
	plan   stripe.Plan
}

// Write writes p at array offset off, stripe by stripe, each under its stripe lock. The caller
// has checked the range.
//
// Whole stripes are written at once: with stable set, parity is computed from p and the member
// writes are issued from p (p is not kept after Write returns); otherwise p is first copied into
// the stripe's head. Other writes land in heads as dirty units and are written out later: a
// whole, aligned 4 KiB unit is referenced in p when pin is non-nil (it takes a hold on pin per
// unit and drops it after the unit's last member write), everything else is copied. With pin
// nil, p is never kept.
//
// Runs of whole stripes are written in batches of up to maxBatchBytes (writeFulls). A write
// that starts inside a stripe and goes on over whole ones joins that first stripe to the batch
// when its head then holds the whole stripe dirty (writeJoined): the usual case of a stream of
// sequential writes that are not multiples of the stripe, such as the kernel client's 128 KiB
// requests over 48 KiB stripes, where the previous write left the stripe's first part in its
// head.
//
// On error n is the length of the prefix of p in the stripes before the one (or the batch)
// that failed, which were written (or cached) completely.
func (c *Cache) Write(p []byte, off int64, stable bool, pin *Pin) (int, error) {
	defer c.arrived(off, int64(len(p)))
	ss := c.layout.StripeSize()
	for done := int64(0); done < int64(len(p)); {
		pos := off + done
		if n := c.joinable(pos, int64(len(p))-done); n > 0 {
			if err := c.writeJoined(p[done:done+n], pos, stable, pin); err != nil {
				return int(done), err
			}
			done += n
			continue
		}
		if k := min((int64(len(p))-done)/ss, c.nBatch); pos%ss == 0 && k >= 2 {
			if err := c.writeFulls(p[done:done+k*ss], pos/ss, k, stable); err != nil {
				return int(done), err
			}
			done += k * ss
			continue
		}
		n := min(int64(len(p))-done, ss-pos%ss)
		if err := c.writeStripe(p[done:done+n], pos, stable, pin); err != nil {
			return int(done), err
		}
		done += n
	}
	return len(p), nil
}

// writeStripe writes q, which lies within one stripe, at array offset pos, under the stripe's
// lock: a whole stripe at once (writeFull); otherwise into the stripe's head as dirty units
// (fill), binding a free head or evicting a clean one if it has none, and queues the head for
// write-out (dirtied). With no head to bind (every head dirty or busy, or a cache of no heads)
// the units go into a spare head that is written out at once and forgotten: a write-through.
func (c *Cache) writeStripe(q []byte, pos int64, stable bool, pin *Pin) error {
	lk := c.locks.For(pos / c.layout.StripeSize())
	lk.Lock()
	defer lk.Unlock()
	return c.writeStripeLocked(q, pos, stable, pin)
}

// writeStripeLocked is writeStripe with the stripe's lock held.
func (c *Cache) writeStripeLocked(q []byte, pos int64, stable bool, pin *Pin) error {
	ss := c.layout.StripeSize()
	s := pos / ss
	h := c.lookup(s)
	if int64(len(q)) == ss {
		return c.writeFull(h, s, q, stable)
	}
	private := h == nil
	if private {
		if h = c.bind(s); h != nil {
			private = false
		} else {
			h = c.spare.Get().(*head)
			c.through.Add(1)
		}
	}
	err := c.fill(h, s, q, pos-s*ss, pin)
	if private {
		if err == nil && h.nDirty > 0 {
			err = c.writeOut(h, s)
		}
		h.reset()
		c.spare.Put(h)
		return err
	}
	if h.nDirty > 0 {
		c.dirtied(h, (pos+int64(len(q)))%stripe.UnitSize != 0)
	}
	return err
}

// WriteCached is writeStripe for a write that can be done without waiting for anything: q
// lies within one stripe at array offset pos, covers whole 4 KiB units only and not the whole
// stripe, the stripe's lock is free, and the stripe has a head or a free or clean head can be
// bound to it. Then q goes into the head as dirty units, the head is queued for write-out as
// writeStripe queues it, and WriteCached reports true; otherwise it reports false having done
// nothing (the caller writes q with Write, which may wait or write through). With ref and
// release non-nil, the units are referenced in q as Write references them for a Pin whose
// release is release (run once the last write-out that reads q has completed: possibly before
// WriteCached returns); otherwise they are copied, and release, if any, runs before it returns.
// The caller has checked the range. (The NBD server's reader takes short writes this way
// itself, without handing them to a worker: nbd.CachedWriter.)
func (c *Cache) WriteCached(q []byte, pos int64, ref bool, release func()) bool {
	ss, n := c.layout.StripeSize(), int64(len(q))
	s := pos / ss
	if n == 0 || n >= ss || pos%stripe.UnitSize != 0 || n%stripe.UnitSize != 0 || pos+n > (s+1)*ss || c.cap == 0 {
		return false
	}
	lk := c.locks.For(s)
	if !lk.TryLock() {
		return false
	}
	h := c.lookup(s)
	if h == nil {
		if h = c.bind(s); h == nil {
			lk.Unlock()
			return false
		}
	}
	var pin *Pin
	if ref && release != nil {
		pin = NewPin(release)
	}
	// Whole units only: fill reads nothing in, so it cannot fail.
	if err := c.fill(h, s, q, pos-s*ss, pin); err != nil {
		panic("cache: fill of whole units failed: " + err.Error())
	}
	c.dirtied(h, false)
	lk.Unlock()
	c.arrived(pos, n)
	switch {
	case pin != nil:
		pin.Drop()
	case release != nil:
		release()
	}
	return true
}

// fill puts q, at offset w within stripe s, into h as dirty units. Units that q covers only in
// part are first read in (rebuilt if their member is missing), so every dirty unit is whole.
func (c *Cache) fill(h *head, s int64, q []byte, w int64, pin *Pin) error {
	C := c.chunk
	// Read in the partly covered units at either end of each chunk piece.
	for o := w; o < w+int64(len(q)); {
		d, cw := int(o/C), o%C
		n := min(C-cw, w+int64(len(q))-o)
		u0, u1 := int(cw/stripe.UnitSize), int((cw+n-1)/stripe.UnitSize)
		if cw%stripe.UnitSize != 0 && h.st[d*c.upc+u0]&stUp == 0 {
			if err := c.readIn(h, s, d, u0); err != nil {
				return err
			}
		}
		if (cw+n)%stripe.UnitSize != 0 && h.st[d*c.upc+u1]&stUp == 0 {
			if err := c.readIn(h, s, d, u1); err != nil {
				return err
			}
		}
		o += n
	}
	var copied int64
	for o := w; o < w+int64(len(q)); {
		d, cw := int(o/C), o%C
		n := min(C-cw, w+int64(len(q))-o)
		for u := int(cw / stripe.UnitSize); int64(u)*stripe.UnitSize < cw+n; u++ {
			lo, hi := max(cw, int64(u)*stripe.UnitSize), min(cw+n, int64(u+1)*stripe.UnitSize)
			src := q[o-w+lo-cw : o-w+hi-cw]
			i := d*c.upc + u
			if hi-lo == stripe.UnitSize && pin != nil && !c.noRefs.Load() {
				if h.refs == nil {
					h.refs = make([]unitRef, c.nd*c.upc)
				}
				h.dropRef(i)
				pin.hold()
				h.refs[i] = unitRef{pin: pin, buf: src}
			} else {
				dst := c.unit(h, d, u)
				if h.refs != nil && h.refs[i].pin != nil { // keep the rest of the unit
					copy(dst, h.refs[i].buf)
					h.dropRef(i)
				}
				copy(dst[lo-int64(u)*stripe.UnitSize:], src)
				copied += hi - lo
			}
			h.setDirty(i)
		}
		o += n
	}
	c.copied.Add(uint64(copied))
	return nil
}

// writeFull writes the whole stripe s from q: parity from q alone, no reads. h is s's head or
// nil; the caller holds s's lock.
func (c *Cache) writeFull(h *head, s int64, q []byte, stable bool) error {
	if stable { // straight from q: forget what the head held, it is all overwritten
		var P []byte
		if h != nil {
			c.forget(h)
			P = h.buf[int64(c.nd)*c.chunk:]
		}
		ws := c.getWork()
		defer c.putWork(ws)
		if P == nil {
			P = ws.old[:c.chunk]
		}
		p := &ws.plan
		stripe.PlanWrite(p, c.layout, stripe.WriteState{Stripe: s, Missing: c.backend.Missing(s)}) // Units nil: written whole
		if err := c.encodeWhole(p, ws.shards, q, P); err != nil {
			return err
		}
		ops := ws.ops[:0]
		for _, r := range p.Writes {
			ops = append(ops, stripe.MemberOp{Role: r.Role, Buf: c.wholeRun(r, q, P), Off: p.Off(r), Write: true, Stripe: s})
		}
		ws.ops = ops[:0]
		if err := c.backend.Do(ops); err != nil {
			return err
		}
		c.checkStripes(s, 1, "full-stripe write") // invariants: parity matches the data
		c.count(p.Kind)
		return nil
	}
	private := h == nil // not cached: copy into a spare head rather than take a cache slot
	if private {
		h = c.spare.Get().(*head)
	}
	for d := range c.nd {
		copy(h.buf[int64(d)*c.chunk:int64(d+1)*c.chunk], q[int64(d)*c.chunk:])
	}
	c.copied.Add(uint64(len(q)))
	for i := range h.st {
		h.dropRef(i)
		h.setDirty(i)
	}
	err := c.writeOut(h, s)
	if private {
		h.reset()
		c.spare.Put(h)
		return err
	}
	if err != nil {
		c.dirtied(h, false) // stays dirty: retried later, reported by Flush
		return err
	}
	h.reset() // keep nothing: written whole, the stripe is unlikely to be read or written again soon
	c.cleaned(h)
	return nil
}

// writeFulls writes the n ≥ 2 whole stripes from s0 on from q, as writeFull does for one, but
// together, under all their locks (LockSpan): writeFullsLocked.
func (c *Cache) writeFulls(q []byte, s0, n int64, stable bool) error {
	c.locks.LockSpan(s0, n)
	defer c.locks.UnlockSpan(s0, n)
	return c.writeFullsLocked(q, s0, n, stable, nil)
}

// joinable returns the length of the piece of a write from array offset pos, rest bytes long,
// that writeJoined writes: from pos, inside a stripe and on a unit boundary, to the end of at
// least one whole stripe after it, as many as a batch holds (nJoin); or 0 when there is no such
// piece (or no heads or no batches).
func (c *Cache) joinable(pos, rest int64) int64 {
	ss := c.layout.StripeSize()
	w := pos % ss
	if w == 0 || w%stripe.UnitSize != 0 || c.cap == 0 || c.nBatch < 2 || c.nJoin < 1 {
		return 0
	}
	k := min((rest-(ss-w))/ss, c.nJoin)
	if k < 1 {
		return 0
	}
	return ss - w + k*ss
}

// writeJoined writes q (a piece joinable returned) at array offset pos, under the locks of all
// its stripes (LockSpan): its first stripe s is partial, then come k whole ones. When s's head
// holds every unit before pos dirty, q's part of s goes into the head, which is then all dirty,
// and the head is written out in the same batch as the whole stripes (writeFullsLocked), one
// vectored write per member for all of them, instead of alone by a write-out goroutine. Otherwise
// it is what Write does without the join: s's part into its head (writeStripeLocked), the whole
// stripes as a batch.
func (c *Cache) writeJoined(q []byte, pos int64, stable bool, pin *Pin) error {
	ss := c.layout.StripeSize()
	s, w := pos/ss, pos%ss
	k := (int64(len(q)) - (ss - w)) / ss
	c.locks.LockSpan(s, k+1)
	defer c.locks.UnlockSpan(s, k+1)
	h := c.lookup(s)
	if h == nil || !c.dirtyBefore(h, w) {
		if err := c.writeStripeLocked(q[:ss-w], pos, stable, pin); err != nil {
			return err
		}
		return c.writeFullsLocked(q[ss-w:], s+1, k, stable, nil)
	}
	// Whole units only: fill reads nothing in, so it cannot fail.
	if err := c.fill(h, s, q[:ss-w], w, pin); err != nil {
		panic("cache: fill of whole units failed: " + err.Error())
	}
	return c.writeFullsLocked(q[ss-w:], s+1, k, stable, h)
}

// dirtyBefore reports whether head h holds every unit before stripe offset w (a multiple of
// stripe.UnitSize) dirty. Unit i of a head's st lies at stripe offset i·stripe.UnitSize.
func (c *Cache) dirtyBefore(h *head, w int64) bool {
	for _, st := range h.st[:w/stripe.UnitSize] {
		if st&stDirty == 0 {
			return false
		}
	}
	return true
}

// writeFullsLocked writes the n ≥ 1 whole stripes from s0 on from q, with their locks held:
// parity of each from its data alone, then one vectored write per member of its chunks of all
// n stripes (data and parity chunks alike are contiguous on a member: chunk s·C of the data
// area), so a 1 MiB write is a few system calls and hand-offs instead of four per stripe.
// Without stable, q is copied first. The stripes' heads, if any, are forgotten (all
// overwritten).
//
// lead, if not nil, is the head of stripe s0-1 (its lock held too), every unit of it dirty: it
// is written whole in the same batch, its parity computed into the head, its chunks written
// from the head's units (copied or referenced); on success it is emptied and clean, as writeFull
// leaves a cached head; on error it stays dirty, queued to be written out again.
//
// On error the stripes may be written in part.
func (c *Cache) writeFullsLocked(q []byte, s0, n int64, stable bool, lead *head) error {
	b := c.batches.Get().(*batch)
	defer func() {
		clear(b.ops[:cap(b.ops)])
		clear(b.vecs[:cap(b.vecs)])
		clear(b.flat[:cap(b.flat)])
		clear(b.lead[:cap(b.lead)])
		clear(b.shards)
		c.batches.Put(b)
	}()
	C, ss := c.chunk, c.layout.StripeSize()
	src := q
	if !stable {
		src = b.data[:len(q)]
		copy(src, q)
		c.copied.Add(uint64(len(q)))
	}
	m := int64(c.layout.Members())
	p := &b.plan
	first, total := s0, n
	if lead != nil {
		first, total = s0-1, n+1
		if err := c.leadPieces(b, lead, first); err != nil {
			return err
		}
	}
	vecs := b.vecs[:n*m]
	clear(vecs)
	for i := range n {
		s := s0 + i
		if h := c.lookup(s); h != nil {
			c.forget(h)
		}
		q, P := src[i*ss:(i+1)*ss], b.par[i*C:(i+1)*C]
		stripe.PlanWrite(p, c.layout, stripe.WriteState{Stripe: s, Missing: c.backend.Missing(s)}) // Units nil: written whole
		if err := c.encodeWhole(p, b.shards, q, P); err != nil {
			return err
		}
		for _, r := range p.Writes { // whole chunks: a whole stripe's plan writes every chunk at Off s·C
			vecs[int64(r.Role)*n+i] = c.wholeRun(r, q, P)
		}
	}
	// One vectored write per member and run of stripes it is not missing in. flat holds every
	// op's Vec back to back (its capacity is never exceeded, so the ops' slices stay valid).
	ops, flat := b.ops[:0], b.flat[:0]
	for r := range m {
		i0, v0 := int64(-1), 0 // the open run: its first stripe (of the batch's total), its first piece in flat
		for i := int64(0); i <= total; i++ {
			var pieces [][]byte
			switch {
			case i == total:
			case lead != nil && i == 0:
				pieces = b.lead[b.leadAt[2*r]:b.leadAt[2*r+1]]
			case lead != nil:
				pieces = vecs[r*n+i-1 : r*n+i]
			default:
				pieces = vecs[r*n+i : r*n+i+1]
			}
			if len(pieces) == 1 && pieces[0] == nil {
				pieces = nil
			}
			if len(pieces) > 0 {
				if i0 < 0 {
					i0, v0 = i, len(flat)
				}
				flat = append(flat, pieces...)
				continue
			}
			if i0 >= 0 {
				ops = append(ops, stripe.MemberOp{Role: int(r), Off: (first + i0) * C, Write: true,
					Vec: flat[v0:len(flat):len(flat)], Stripe: first + i0, Stripes: i - i0})
				i0 = -1
			}
		}
	}
	b.ops, b.flat = ops, flat
	if err := c.backend.Do(ops); err != nil {
		if lead != nil {
			lead.mustRCW = true
			c.dirtied(lead, false)
		}
		return err
	}
	if lead != nil {
		lead.reset() // keep nothing, as writeFull: written whole
		c.cleaned(lead)
	}
	c.checkStripes(first, total, "batch of full-stripe writes") // invariants: parity matches the data
	c.full.Add(uint64(total))
	return nil
}

// leadPieces computes the parity of stripe s, whose head h holds every unit dirty, into the
// head, and sets b.lead to the buffers of its planned writes, one run of them per role (units
// contiguous in memory merged), role r's at b.lead[b.leadAt[2r]:b.leadAt[2r+1]] (empty for a
// role not written).
func (c *Cache) leadPieces(b *batch, h *head, s int64) error {
	p := &b.plan
	stripe.PlanWrite(p, c.layout, stripe.WriteState{Stripe: s, Missing: c.backend.Missing(s)}) // Units nil: written whole
	for u, col := range p.Cols {
		if col != stripe.ColEncode {
			continue
		}
		for d := range c.nd {
			b.shards[d] = c.src(h, d, u)
		}
		b.shards[c.nd] = c.parityUnit(h, u)
		if err := c.coder.Encode(b.shards); err != nil {
			return err
		}
	}
	clear(b.shards)
	lp := b.lead[:0]
	clear(b.leadAt)
	for _, r := range p.Writes {
		lo := len(lp)
		for u := r.Unit; u < r.Unit+r.N; u++ {
			var x []byte
			if r.Chunk == c.nd {
				x = c.parityUnit(h, u)
			} else {
				x = c.src(h, r.Chunk, u)
			}
			if k := len(lp); k > lo && contiguous(lp[k-1], x) {
				lp[k-1] = lp[k-1][:len(lp[k-1])+len(x)]
			} else {
				lp = append(lp, x)
			}
		}
		b.leadAt[2*r.Role], b.leadAt[2*r.Role+1] = lo, len(lp)
	}
	b.lead = lp
	return nil
}

// encodeWhole computes into P the parity of the stripe whose data chunks lie back to back in q,
// for each run of columns that plan p encodes (a whole stripe's plan encodes every column, or
// none when the parity member is missing). shards is scratch for D+1 slices.
func (c *Cache) encodeWhole(p *stripe.Plan, shards [][]byte, q, P []byte) error {
	defer clear(shards)
	for u0 := 0; u0 < len(p.Cols); {
		if p.Cols[u0] != stripe.ColEncode {
			u0++
			continue
		}
		u1 := u0 + 1
		for u1 < len(p.Cols) && p.Cols[u1] == stripe.ColEncode {
			u1++
		}
		lo, hi := int64(u0)*stripe.UnitSize, int64(u1)*stripe.UnitSize
		for d := range c.nd {
			shards[d] = q[int64(d)*c.chunk+lo : int64(d)*c.chunk+hi]
		}
		shards[c.nd] = P[lo:hi]
		if err := c.coder.Encode(shards); err != nil {
			return err
		}
		u0 = u1
	}
	return nil
}

// wholeRun returns the buffer of planned run r of a stripe whose data chunks lie back to back in
// q and whose parity chunk is P.
func (c *Cache) wholeRun(r stripe.Run, q, P []byte) []byte {
	lo, hi := int64(r.Unit)*stripe.UnitSize, int64(r.Unit+r.N)*stripe.UnitSize
	if r.Chunk == c.nd {
		return P[lo:hi]
	}
	o := int64(r.Chunk) * c.chunk
	return q[o+lo : o+hi]
}

// Overwritten records that the caller has written stripes [s0, s0+n) whole itself, data and
// parity, under their locks (held): their heads, if any, are forgotten (everything they held
// is overwritten), and the stripes count as full-stripe writes. (The array's placed writes,
// whose payload is read straight into the members.)
func (c *Cache) Overwritten(s0, n int64) {
	for s := s0; s < s0+n; s++ {
		if h := c.lookup(s); h != nil {
			c.forget(h)
		}
	}
	c.full.Add(uint64(n))
}

// DropClean forgets stripe s's head if it holds no dirty unit, and reports whether s now has
// no head: true also when it had none, false when its head is dirty. The caller holds s's
// lock and is about to write the stripe's members itself, data and parity (the array's placed
// read-modify-writes), which a clean head's units would then no longer match.
func (c *Cache) DropClean(s int64) bool {
	if c.cap == 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.heads[s]
	if h == nil {
		return true
	}
	if h.dirty || h.nDirty > 0 {
		return false
	}
	h.reset()
	c.unbindLocked(h)
	return true
}

// forget empties h, a head whose stripe is being overwritten whole (its lock held).
func (c *Cache) forget(h *head) {
	wasDirty := h.nDirty > 0
	h.reset()
	if wasDirty {
		c.cleaned(h)
	}
}

// CheckStripes is the invariants build's check that stripes [s0, s0+n) (their locks held) have
// parity matching their data, after a write the caller did itself (what names it); a no-op
// otherwise.
func (c *Cache) CheckStripes(s0, n int64, what string) { c.checkStripes(s0, n, what) }
