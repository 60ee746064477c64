package cache

import "github.com/raid5d/raid5d/stripe"

// readIn makes data unit (d, u) of h up to date from the members: read, or rebuilt from the
// rest of the stripe when its member is missing.
func (c *Cache) readIn(h *head, s int64, d, u int) error {
	dst := c.unit(h, d, u)
	off := s*c.chunk + int64(u)*stripe.UnitSize
	role := c.layout.DataMember(s, d)
	ws := c.getWork() // its ops: a slice literal handed to Backend.Do would escape
	defer c.putWork(ws)
	ops := ws.ops[:0]
	if role != c.backend.Missing(s) {
		ops = append(ops, stripe.MemberOp{Role: role, Buf: dst, Off: off, Stripe: s})
		ws.ops = ops[:0]
		if err := c.backend.Do(ops); err != nil {
			return err
		}
		h.setUp(d*c.upc + u)
		return nil
	}
	for i := 0; i <= c.nd; i++ {
		if i == d {
			ws.shards[i] = dst
			continue
		}
		r := c.layout.ParityMember(s)
		if i < c.nd {
			r = c.layout.DataMember(s, i)
		}
		ws.shards[i] = ws.old[int64(i)*stripe.UnitSize : int64(i+1)*stripe.UnitSize]
		ops = append(ops, stripe.MemberOp{Role: r, Buf: ws.shards[i], Off: off, Stripe: s})
	}
	ws.ops = ops[:0]
	if err := c.backend.Do(ops); err != nil {
		return err
	}
	if err := c.coder.Reconstruct(ws.shards, d); err != nil {
		return err
	}
	h.setUp(d*c.upc + u)
	return nil
}

// Heads sets bit i of bits (bit i%64 of bits[i/64]) for each stripe s0+i, i < n, that has a
// head in the cache, and clears the others; bits must hold n bits. Under one lock, so that a
// read spanning many stripes asks once: a stripe without a head has nothing newer than its
// members, and ReadExtent would send all of it to miss — a reader may read such a stripe from
// the members directly, merging it with its neighbours.
func (c *Cache) Heads(s0, n int64, bits []uint64) {
	clear(bits[:(n+63)/64])
	if c.cap == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.heads) == 0 {
		return
	}
	for i := range n {
		if c.heads[s0+i] != nil {
			bits[i/64] |= 1 << (i % 64)
		}
	}
}

// ReadExtent reads extent e (of one data chunk) into dst: the units up to date in the cache
// are copied from it, and each run of the others is read by miss (which reads the member, or
// rebuilds the range from the rest of the stripe). miss is called without any lock held.
func (c *Cache) ReadExtent(dst []byte, e stripe.Extent, miss func(dst []byte, e stripe.Extent) error) error {
	if c.cap == 0 { // no heads: nothing cached, nothing to count
		return miss(dst, e)
	}
	s := e.Stripe
	c.mu.Lock()
	h := c.heads[s]
	c.mu.Unlock()
	if h == nil {
		c.misses.Add(1)
		return miss(dst, e)
	}
	lk := c.locks.For(s)
	lk.Lock()
	if h = c.lookup(s); h == nil {
		lk.Unlock()
		c.misses.Add(1)
		return miss(dst, e)
	}
	w0 := e.MemberOff - s*c.chunk
	u0, u1 := int(w0/stripe.UnitSize), int((w0+e.Len-1)/stripe.UnitSize)
	var need [stripe.MaxChunk / stripe.UnitSize / 64]uint64 // units to read from the members
	missing := false
	for u := u0; u <= u1; u++ {
		lo, hi := max(w0, int64(u)*stripe.UnitSize), min(w0+e.Len, int64(u+1)*stripe.UnitSize)
		if h.st[e.Data*c.upc+u]&stUp == 0 {
			need[u/64] |= 1 << (u % 64)
			missing = true
			continue
		}
		copy(dst[lo-w0:hi-w0], c.src(h, e.Data, u)[lo-int64(u)*stripe.UnitSize:])
	}
	lk.Unlock()
	if !missing {
		c.hits.Add(1)
		return nil
	}
	c.misses.Add(1)
	for u := u0; u <= u1; {
		if need[u/64]&(1<<(u%64)) == 0 {
			u++
			continue
		}
		v := u
		for v <= u1 && need[v/64]&(1<<(v%64)) != 0 {
			v++
		}
		lo, hi := max(w0, int64(u)*stripe.UnitSize), min(w0+e.Len, int64(v)*stripe.UnitSize)
		sub := e
		sub.MemberOff, sub.BufOff, sub.Len = s*c.chunk+lo, e.BufOff+lo-w0, hi-lo
		if err := miss(dst[lo-w0:hi-w0], sub); err != nil {
			return err
		}
		u = v
	}
	return nil
}

// Dirty reports whether any stripe of [s0, s0+n) has a cache head with dirty units: data
// newer than what the members hold. A caller that holds those stripes' locks gets an exact
// answer: no write or write-out of them can be under way, and every write that returned has
// either left its units dirty or reached the members. Without the locks it is a hint, which
// may be stale by the time it returns. It takes only Cache.mu, so it may be called under a
// stripe lock (the cache's lock order), and costs a map lookup per stripe, or a walk of the
// heads when the range holds more stripes than the cache has heads.
func (c *Cache) Dirty(s0, n int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n <= int64(len(c.heads)) {
		for s := s0; s < s0+n; s++ {
			if h := c.heads[s]; h != nil && h.dirty {
				return true
			}
		}
		return false
	}
	for s, h := range c.heads {
		if s >= s0 && s < s0+n && h.dirty {
			return true
		}
	}
	return false
}
