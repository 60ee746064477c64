package cache

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/parity"
	"github.com/raid5d/raid5d/stripe"
)

// Defaults of Options.
const (
	DefaultWriteBackDelay = 5 * time.Millisecond
	DefaultWriteBackers   = 4
)

// Backend is how a Cache reaches the array's members.
type Backend interface {
	// Do performs ops, concurrently where it can, and returns an error if any failed. It keeps
	// none of the buffers.
	Do(ops []stripe.MemberOp) error
	// Missing returns the role of the member that is missing in stripe s, or -1. Its chunks
	// are never read or written; they are rebuilt from, and folded into, the rest of their
	// stripe. The answer for s may change only while s's lock is held by whoever changes it
	// (a rebuild moving past s), so it is stable for a caller holding s's lock.
	Missing(s int64) int
}

// Options configure a Cache.
type Options struct {
	// Stripes is the capacity in stripes (at least 1). Memory: Stripes × members × chunk bytes
	// (every head has a buffer per data chunk and one for parity), allocated as heads are first
	// used.
	Stripes int
	// WriteBackDelay is how long a partial stripe waits for later writes to fill it before it
	// is written out; 0 means DefaultWriteBackDelay. Full stripes, and everything while more
	// than half the heads are dirty, are written out at once.
	WriteBackDelay time.Duration
	// WriteBackers is the number of background write-out goroutines (stripes written out in
	// parallel); 0 means DefaultWriteBackers.
	WriteBackers int
	Logger       *slog.Logger // nil: discard
	// MustReconstruct, if not nil, reports whether stripe s's parity on the members may be
	// stale (an array resyncing after a crash): a partial write-out of s then reconstructs
	// the parity of the units it writes from the data (reconstruct-write), never folds a
	// difference into the old parity (read-modify-write). Called with s's lock held.
	MustReconstruct func(s int64) bool
}

// Counters are a Cache's cumulative counters.
type Counters struct {
	FullStripeWrites uint64 // stripes written with parity from new data alone: no reads
	RMWWrites        uint64 // partial write-outs by read-modify-write
	RCWWrites        uint64 // partial write-outs by reconstruct-write
	CopiedBytes      uint64 // bytes of writes copied into heads
	Hits             uint64 // read extents served from the cache alone
	Misses           uint64 // read extents that needed member reads
	Evictions        uint64 // clean heads reused for another stripe
	WriteThroughs    uint64 // partial writes written synchronously: no head was free
}

// Cache is a write-back RAID-5 stripe cache: one head per cached stripe, holding per 4 KiB unit
// of each data chunk whether it is up to date and whether it is dirty (newer than the members),
// with its data either copied into the head or referenced in a pinned caller buffer (Pin).
//
// A write that covers a whole stripe is written at once with parity from the new data alone.
// Other writes land in the head as dirty units and return; background goroutines write a head
// out after WriteBackDelay, or at once when it has become full or the cache is under pressure,
// choosing read-modify-write or reconstruct-write by counting the member reads each needs.
// Reads are served from up-to-date units and go to the members for the rest, so a read sees
// every write that returned before it started.
//
// # Locking
//
// A head bound to stripe s is guarded by the stripe lock stripe.Locks.For(s), shared with the array:
// every access to its units, and all member I/O for the stripe, happens under it. Write-outs
// hold it for their whole duration, so a write to a stripe being written out waits, and a
// write-out never races a newer write to the same units. Cache.mu guards the table of heads,
// the LRU and write-out lists and each head's binding; it is taken under a stripe lock, never
// the other way round, and other stripes' locks are taken only with TryLock (eviction).
//
// All methods may be called concurrently.
type Cache struct {
	layout stripe.Layout
	coder  *parity.Coder
	m      Backend
	locks  *stripe.Locks
	delay  time.Duration
	nwb    int
	log    *slog.Logger
	mustRC func(s int64) bool // Options.MustReconstruct, or nil
	nd     int                // data chunks per stripe
	chunk  int64              // chunk size
	upc    int                // units per chunk
	cap    int

	mu      sync.Mutex // guards heads, lru, free, delayed, urgent, queued, err, and heads' bindings and links
	heads   map[int64]*head
	lru     lruList // bound heads, most recently used first
	free    []*head // unbound heads
	delayed qList   // dirty heads waiting for WriteBackDelay, oldest first
	urgent  qList   // full heads, to be written out at once
	queued  int     // heads in delayed or urgent
	err     error   // first background write-out error since the last Flush

	kick chan struct{} // wakes a write-out goroutine
	stop context.CancelFunc
	wg   sync.WaitGroup

	work    sync.Pool // *workspace
	spare   sync.Pool // *head, unbound, for write-through
	batches sync.Pool // *batch
	nBatch  int64     // most stripes in one batch (writeFulls); < 2: no batches

	full, rmw, rcw, copied, hits, misses, evictions, through atomic.Uint64
	// noRefs, set by Unpin, makes fill copy every unit instead of referencing a pinned buffer.
	noRefs atomic.Bool
}

// Unit states.
const (
	stUp    = 1 // the unit's data is known (in buf or refs)
	stDirty = 2 // newer than the members; implies stUp
)

// Queues.
const (
	qNone = iota
	qDelayed
	qUrgent
)

type unitRef struct {
	pin *Pin
	buf []byte // stripe.UnitSize bytes of the pinned buffer
}

// head is one cached stripe.
type head struct {
	// Guarded by Cache.mu.
	stripe       int64
	bound        bool
	dirty        bool // mirror of nDirty > 0, for Flush and eviction
	lprev, lnext *head
	qprev, qnext *head
	q            uint8
	first        time.Time // when it was queued
	due          time.Time // when to write it out: WriteBackDelay after its last write, at most maxAge after first

	// Guarded by the lock of stripe while bound; by its owner while unbound.
	buf     []byte    // (D+1)×chunk: data chunk d at [d·chunk, (d+1)·chunk), then parity scratch
	st      []uint8   // per data unit (d·upc + u)
	refs    []unitRef // per data unit; nil until a unit is first referenced
	nUp     int
	nDirty  int
	mustRCW bool // a write-out failed half-way: old parity cannot be trusted
}

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

// New returns a cache for the array of layout, whose parity coder is coder, reaching the
// members through m and locking stripes in locks. Start starts its write-out goroutines.
func New(layout stripe.Layout, coder *parity.Coder, m Backend, locks *stripe.Locks, opts Options) *Cache {
	c := &Cache{
		layout: layout, coder: coder, m: m, locks: locks,
		delay: opts.WriteBackDelay, nwb: opts.WriteBackers, log: opts.Logger, mustRC: opts.MustReconstruct,
		nd: layout.DataMembers(), chunk: layout.ChunkSize(), upc: int(layout.ChunkSize() / stripe.UnitSize),
		cap:   max(opts.Stripes, 1),
		heads: make(map[int64]*head),
		kick:  make(chan struct{}, 1),
	}
	if c.delay <= 0 {
		c.delay = DefaultWriteBackDelay
	}
	if c.nwb <= 0 {
		c.nwb = DefaultWriteBackers
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c.lru.init()
	c.delayed.init()
	c.urgent.init()
	c.free = make([]*head, c.cap)
	for i := range c.free {
		c.free[i] = &head{}
	}
	c.work.New = func() any {
		return &workspace{ops: make([]stripe.MemberOp, 0, 2*(c.nd+1)), shards: make([][]byte, c.nd+1)}
	}
	c.spare.New = func() any { h := &head{}; c.alloc(h); return h }
	c.nBatch = min(maxBatchBytes/layout.StripeSize(), stripe.NumLocks)
	c.batches.New = func() any {
		n, m := c.nBatch, int64(layout.Members())
		return &batch{
			data: make([]byte, n*layout.StripeSize()), par: make([]byte, n*c.chunk),
			ops: make([]stripe.MemberOp, 0, n*m), vecs: make([][]byte, 0, n*m), shards: make([][]byte, c.nd+1),
		}
	}
	return c
}

// maxBatchBytes bounds the data of one batch of whole stripes written together (writeFulls),
// and so the batch's scratch memory: its parity, and its copy of the data without stable pages.
const maxBatchBytes = 1 << 20

// batch is the scratch memory of one writeFulls; pooled (Cache.batches).
type batch struct {
	data   []byte // nBatch stripes of data: the copy of the caller's, without stable pages
	par    []byte // nBatch parity chunks
	ops    []stripe.MemberOp
	vecs   [][]byte // the ops' Vec, back to back
	shards [][]byte
}

// Capacity returns the capacity in stripes.
func (c *Cache) Capacity() int { return c.cap }

// Start starts the write-out goroutines; they run until ctx is done or Close.
func (c *Cache) Start(ctx context.Context) {
	ctx, c.stop = context.WithCancel(ctx)
	for range c.nwb {
		c.wg.Add(1)
		go c.writeBacker(ctx)
	}
}

// Close stops the write-out goroutines, waits for them, and writes out every dirty head
// (Flush, without syncing the members: that is the caller's).
func (c *Cache) Close() error {
	if c.stop != nil {
		c.stop()
	}
	c.wg.Wait()
	return c.Flush()
}

// Counters returns the cumulative counters.
func (c *Cache) Counters() Counters {
	return Counters{
		FullStripeWrites: c.full.Load(), RMWWrites: c.rmw.Load(), RCWWrites: c.rcw.Load(),
		CopiedBytes: c.copied.Load(), Hits: c.hits.Load(), Misses: c.misses.Load(),
		Evictions: c.evictions.Load(), WriteThroughs: c.through.Load(),
	}
}

func (c *Cache) alloc(h *head) {
	h.buf = make([]byte, int64(c.nd+1)*c.chunk)
	h.st = make([]uint8, c.nd*c.upc)
}

// unit returns the head's own buffer of data unit (d, u), with capacity to the end of chunk d
// so that consecutive units can be merged into one member I/O.
func (c *Cache) unit(h *head, d, u int) []byte {
	o := int64(d)*c.chunk + int64(u)*stripe.UnitSize
	return h.buf[o : o+stripe.UnitSize : int64(d+1)*c.chunk]
}

// src returns where data unit (d, u)'s bytes are: a pinned reference or the head's buffer.
func (c *Cache) src(h *head, d, u int) []byte {
	if h.refs != nil {
		if r := h.refs[d*c.upc+u]; r.pin != nil {
			return r.buf
		}
	}
	return c.unit(h, d, u)
}

func (c *Cache) parityUnit(h *head, u int) []byte {
	o := int64(c.nd)*c.chunk + int64(u)*stripe.UnitSize
	return h.buf[o : o+stripe.UnitSize : int64(c.nd+1)*c.chunk]
}

// dropRef drops unit i's reference, if any.
func (h *head) dropRef(i int) {
	if h.refs != nil && h.refs[i].pin != nil {
		h.refs[i].pin.Drop()
		h.refs[i] = unitRef{}
	}
}

// reset forgets every unit, dropping references.
func (h *head) reset() {
	if h.refs != nil {
		for i := range h.refs {
			h.dropRef(i)
		}
	}
	clear(h.st)
	h.nUp, h.nDirty, h.mustRCW = 0, 0, false
}

func (h *head) setUp(i int) {
	if h.st[i]&stUp == 0 {
		h.st[i] |= stUp
		h.nUp++
	}
}

func (h *head) setDirty(i int) {
	h.setUp(i)
	if h.st[i]&stDirty == 0 {
		h.st[i] |= stDirty
		h.nDirty++
	}
}

// lookup returns the head bound to stripe s, or nil, and marks it recently used. The caller
// holds s's lock if it will use the head.
func (c *Cache) lookup(s int64) *head {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.heads[s]
	if h != nil {
		c.lru.remove(h)
		c.lru.pushFront(h)
	}
	return h
}

// bind binds a free or evicted head to stripe s and returns it, or nil if every head is dirty
// or busy. The caller holds s's lock and s has no head.
func (c *Cache) bind(s int64) *head {
	c.mu.Lock()
	defer c.mu.Unlock()
	var h *head
	if n := len(c.free); n > 0 {
		h, c.free = c.free[n-1], c.free[:n-1]
	} else {
		const scan = 64 // least recently used heads looked at
		v := c.lru.back()
		for i := 0; v != nil && i < scan; v, i = c.lru.prev(v), i+1 {
			if v.dirty {
				continue
			}
			own := stripe.SameLock(v.stripe, s) // we hold its lock already
			if !own && !c.locks.For(v.stripe).TryLock() {
				continue // in use
			}
			v.reset()
			if !own {
				c.locks.For(v.stripe).Unlock()
			}
			c.unbindLocked(v)
			c.free = c.free[:len(c.free)-1] // unbindLocked put it there
			c.evictions.Add(1)
			h = v
			break
		}
		if h == nil {
			c.kickLocked()
			return nil
		}
	}
	if h.buf == nil {
		c.alloc(h)
	}
	h.stripe, h.bound = s, true
	c.heads[s] = h
	c.lru.pushFront(h)
	return h
}

// unbindLocked removes h from the table and lists and puts it on the free list. The caller
// holds mu and h's stripe lock, and has reset h.
func (c *Cache) unbindLocked(h *head) {
	delete(c.heads, h.stripe)
	c.lru.remove(h)
	c.dequeueLocked(h)
	h.bound, h.dirty = false, false
	c.free = append(c.free, h)
}

func (c *Cache) dequeueLocked(h *head) {
	switch h.q {
	case qDelayed:
		c.delayed.remove(h)
	case qUrgent:
		c.urgent.remove(h)
	default:
		return
	}
	h.q = qNone
	c.queued--
}

func (c *Cache) kickLocked() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// dirtied records under mu that h (bound, its lock held) has dirty units: it is queued for
// write-out, at once if it is full.
func (c *Cache) dirtied(h *head) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.dirty = true
	full := h.nUp == c.nd*c.upc
	switch {
	case full && h.q != qUrgent:
		c.dequeueLocked(h)
		c.urgent.pushBack(h)
		h.q = qUrgent
		c.queued++
		c.kickLocked()
	case h.q == qNone:
		h.first = time.Now()
		h.due = h.first.Add(c.delay)
		c.delayed.pushBack(h)
		h.q = qDelayed
		c.queued++
		if c.queued == 1 || c.queued > c.cap/2 {
			c.kickLocked()
		}
	case h.q == qDelayed: // still being written: wait for more
		h.due = time.Now().Add(c.delay)
		if limit := h.first.Add(maxAge * c.delay); h.due.After(limit) {
			h.due = limit
		}
	}
}

// cleaned records under mu that h (its lock held) has no dirty units left.
func (c *Cache) cleaned(h *head) {
	c.mu.Lock()
	h.dirty = false
	if h.bound {
		c.dequeueLocked(h)
	}
	c.mu.Unlock()
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
// Runs of whole stripes are written in batches of up to maxBatchBytes (writeFulls).
//
// On error n is the length of the prefix of p in the stripes before the one (or the batch)
// that failed, which were written (or cached) completely.
func (c *Cache) Write(p []byte, off int64, stable bool, pin *Pin) (int, error) {
	ss := c.layout.StripeSize()
	for done := int64(0); done < int64(len(p)); {
		pos := off + done
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

// writeStripe writes q, which lies within one stripe, at array offset pos.
func (c *Cache) writeStripe(q []byte, pos int64, stable bool, pin *Pin) error {
	ss := c.layout.StripeSize()
	s := pos / ss
	lk := c.locks.For(s)
	lk.Lock()
	defer lk.Unlock()
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
		c.dirtied(h)
	}
	return err
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

// readIn makes data unit (d, u) of h up to date from the members: read, or rebuilt from the
// rest of the stripe when its member is missing.
func (c *Cache) readIn(h *head, s int64, d, u int) error {
	dst := c.unit(h, d, u)
	off := s*c.chunk + int64(u)*stripe.UnitSize
	role := c.layout.DataMember(s, d)
	if role != c.m.Missing(s) {
		if err := c.m.Do([]stripe.MemberOp{{Role: role, Buf: dst, Off: off}}); err != nil {
			return err
		}
		h.setUp(d*c.upc + u)
		return nil
	}
	ws := c.getWork()
	defer c.putWork(ws)
	ops := ws.ops[:0]
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
		ops = append(ops, stripe.MemberOp{Role: r, Buf: ws.shards[i], Off: off})
	}
	ws.ops = ops[:0]
	if err := c.m.Do(ops); err != nil {
		return err
	}
	if err := c.coder.Reconstruct(ws.shards, d); err != nil {
		return err
	}
	h.setUp(d*c.upc + u)
	return nil
}

// writeFull writes the whole stripe s from q: parity from q alone, no reads. h is s's head or
// nil; the caller holds s's lock.
func (c *Cache) writeFull(h *head, s int64, q []byte, stable bool) error {
	if stable { // straight from q: forget what the head held, it is all overwritten
		var P []byte
		if h != nil {
			wasDirty := h.nDirty > 0
			h.reset()
			if wasDirty {
				c.cleaned(h)
			}
			P = h.buf[int64(c.nd)*c.chunk:]
		}
		ws := c.getWork()
		defer c.putWork(ws)
		if P == nil {
			P = ws.old[:c.chunk]
		}
		for d := range c.nd {
			ws.shards[d] = q[int64(d)*c.chunk : int64(d+1)*c.chunk]
		}
		ws.shards[c.nd] = P
		if err := c.coder.Encode(ws.shards); err != nil {
			return err
		}
		miss := c.m.Missing(s)
		ops := ws.ops[:0]
		for d := 0; d <= c.nd; d++ {
			r := c.layout.ParityMember(s)
			if d < c.nd {
				r = c.layout.DataMember(s, d)
			}
			if r != miss {
				ops = append(ops, stripe.MemberOp{Role: r, Buf: ws.shards[d], Off: s * c.chunk, Write: true})
			}
		}
		ws.ops = ops[:0]
		clear(ws.shards)
		if err := c.m.Do(ops); err != nil {
			return err
		}
		c.full.Add(1)
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
		c.dirtied(h) // stays dirty: retried later, reported by Flush
		return err
	}
	h.reset() // keep nothing: written whole, the stripe is unlikely to be read or written again soon
	c.cleaned(h)
	return nil
}

// writeFulls writes the n ≥ 2 whole stripes from s0 on from q, as writeFull does for one, but
// together: under all their locks (LockSpan), parity of each from its data alone, then one
// vectored write per member of its chunks of all n stripes (data and parity chunks alike are
// contiguous on a member: chunk s·C of the data area), so a 1 MiB write is a few system calls
// and hand-offs instead of four per stripe. Without stable, q is copied first. The stripes'
// heads, if any, are forgotten (all overwritten). On error the stripes may be written in part.
func (c *Cache) writeFulls(q []byte, s0, n int64, stable bool) error {
	c.locks.LockSpan(s0, n)
	defer c.locks.UnlockSpan(s0, n)
	b := c.batches.Get().(*batch)
	defer func() {
		clear(b.ops[:cap(b.ops)])
		clear(b.vecs[:cap(b.vecs)])
		clear(b.shards)
		c.batches.Put(b)
	}()
	C, D, ss := c.chunk, int64(c.nd), c.layout.StripeSize()
	src := q
	if !stable {
		src = b.data[:len(q)]
		copy(src, q)
		c.copied.Add(uint64(len(q)))
	}
	for i := range n {
		s := s0 + i
		if h := c.lookup(s); h != nil {
			wasDirty := h.nDirty > 0
			h.reset()
			if wasDirty {
				c.cleaned(h)
			}
		}
		for d := range D {
			b.shards[d] = src[i*ss+d*C : i*ss+(d+1)*C]
		}
		b.shards[D] = b.par[i*C : (i+1)*C]
		if err := c.coder.Encode(b.shards); err != nil {
			return err
		}
	}
	ops, vecs := b.ops[:0], b.vecs[:0]
	for r := range c.layout.Members() {
		k0 := len(vecs) // the current op's first buffer in vecs
		for i := range n {
			s := s0 + i
			if r == c.m.Missing(s) { // end the op before the chunk it must skip
				if len(vecs) > k0 {
					ops = append(ops, stripe.MemberOp{Role: r, Off: (s0 + i - int64(len(vecs)-k0)) * C, Write: true, Vec: vecs[k0:len(vecs):len(vecs)]})
				}
				k0 = len(vecs)
				continue
			}
			var chunk []byte
			if r == c.layout.ParityMember(s) {
				chunk = b.par[i*C : (i+1)*C]
			} else {
				d := int64(c.layout.DataIndex(s, r))
				chunk = src[i*ss+d*C : i*ss+(d+1)*C]
			}
			vecs = append(vecs, chunk)
		}
		if len(vecs) > k0 {
			ops = append(ops, stripe.MemberOp{Role: r, Off: (s0 + n - int64(len(vecs)-k0)) * C, Write: true, Vec: vecs[k0:len(vecs):len(vecs)]})
		}
	}
	b.ops, b.vecs = ops, vecs
	if err := c.m.Do(ops); err != nil {
		return err
	}
	c.full.Add(uint64(n))
	return nil
}

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

// Heads sets bit i of bits (bit i%64 of bits[i/64]) for each stripe s0+i, i < n, that has a
// head in the cache, and clears the others; bits must hold n bits. Under one lock, so that a
// read spanning many stripes asks once: a stripe without a head has nothing newer than its
// members, and ReadExtent would send all of it to miss — a reader may read such a stripe from
// the members directly, merging it with its neighbours.
func (c *Cache) Heads(s0, n int64, bits []uint64) {
	clear(bits[:(n+63)/64])
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

// Unpin copies every unit the cache holds by reference to a pinned caller buffer into the
// head's own buffer, drops the reference (the buffer's release runs when its last one goes),
// and from then on copies instead of referencing. An array whose dirty stripes can no longer
// be written out (it has failed) calls it, so that its callers get their buffers back while
// what they wrote stays readable in the cache. It takes each stripe's lock in turn: the
// caller holds none.
func (c *Cache) Unpin() {
	// A fill that still saw noRefs false bound its head before this store, so the sweep below
	// finds that head; one that sees it true references nothing.
	c.noRefs.Store(true)
	c.mu.Lock()
	stripes := make([]int64, 0, len(c.heads))
	for s := range c.heads {
		stripes = append(stripes, s)
	}
	c.mu.Unlock()
	for _, s := range stripes {
		lk := c.locks.For(s)
		lk.Lock()
		c.mu.Lock()
		h := c.heads[s]
		c.mu.Unlock()
		if h != nil && h.refs != nil { // h.refs is guarded by s's lock
			for i, r := range h.refs {
				if r.pin != nil {
					copy(c.unit(h, i/c.upc, i%c.upc), r.buf)
					h.dropRef(i)
				}
			}
		}
		lk.Unlock()
	}
}

// Discard forgets the stripes [s0, s0+n), dirty units included (their references are
// released): the caller has just made them read as zeroes on every member. The caller holds
// their locks (stripe.Locks.LockSpan).
func (c *Cache) Discard(s0, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	drop := func(h *head) {
		h.reset()
		c.unbindLocked(h)
	}
	if n <= int64(len(c.heads)) {
		for s := s0; s < s0+n; s++ {
			if h := c.heads[s]; h != nil {
				drop(h)
			}
		}
		return
	}
	for s, h := range c.heads {
		if s >= s0 && s < s0+n {
			drop(h)
		}
	}
}

// writeBack writes out stripe s's head if it is dirty.
func (c *Cache) writeBack(s int64) error {
	lk := c.locks.For(s)
	lk.Lock()
	defer lk.Unlock()
	return c.WriteOutLocked(s)
}

// WriteOutLocked writes out stripe s's head if it is dirty; the caller holds s's lock (a
// rebuild or scrub that must see the stripe's latest data on the members).
func (c *Cache) WriteOutLocked(s int64) error {
	h := c.lookup(s)
	if h == nil || h.nDirty == 0 {
		return nil
	}
	if err := c.writeOut(h, s); err != nil {
		return err
	}
	c.cleaned(h)
	return nil
}

// FlushRange writes out the heads of the stripes that [off, off+n) touches.
func (c *Cache) FlushRange(off, n int64) error {
	if n <= 0 {
		return nil
	}
	ss := c.layout.StripeSize()
	var errs []error
	for s := off / ss; s <= (off+n-1)/ss; s++ {
		if err := c.writeBack(s); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Flush writes out every head dirty when it is called, several stripes in parallel, and
// returns their errors together with any background write-out error since the last Flush.
// Heads whose write-out fails stay dirty. It does not sync the members.
func (c *Cache) Flush() error {
	c.mu.Lock()
	var todo []int64
	for s, h := range c.heads {
		if h.dirty {
			todo = append(todo, s)
		}
	}
	c.mu.Unlock()
	errs := make([]error, len(todo))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(c.nwb, len(todo)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(todo)); i = next.Add(1) - 1 {
				errs[i] = c.writeBack(todo[i])
			}
		})
	}
	wg.Wait()
	c.mu.Lock()
	errs = append(errs, c.err)
	c.err = nil
	c.mu.Unlock()
	return errors.Join(errs...)
}

// writeBacker is a write-out goroutine: it writes out urgent heads at once, delayed ones when
// they are due, and the oldest dirty heads regardless while more than half the cache is dirty.
func (c *Cache) writeBacker(ctx context.Context) {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		c.mu.Lock()
		h, wait := c.nextLocked(time.Now())
		var s int64
		if h != nil {
			s = h.stripe
			if c.queued > 0 {
				c.kickLocked() // more work: wake another
			}
		}
		c.mu.Unlock()
		if h == nil {
			if wait >= 0 {
				t.Reset(wait)
			}
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-c.kick:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if err := c.writeBack(s); err != nil {
			c.mu.Lock()
			if c.err == nil {
				c.log.Error("stripe: background write-out failed; the data stays dirty in the cache and the next Flush reports it", "stripe", s, "err", err)
				c.err = err
			}
			c.mu.Unlock()
		}
	}
}

// maxAge bounds, in units of WriteBackDelay, how long a partial stripe that keeps being
// written waits in the cache.
const maxAge = 8

// nextLocked takes the next head to write out off its queue, or returns how long to wait
// (-1: until kicked). The delayed queue is in order of first write; a head at its front that
// is still being written (its due time moved on) goes to the back, behind the others.
func (c *Cache) nextLocked(now time.Time) (*head, time.Duration) {
	if h := c.urgent.front(); h != nil {
		c.dequeueLocked(h)
		return h, 0
	}
	for range c.queued + 1 {
		h := c.delayed.front()
		if h == nil {
			return nil, -1
		}
		if c.queued > c.cap/2 || !now.Before(h.due) {
			c.dequeueLocked(h)
			return h, 0
		}
		if h.qnext == &c.delayed.root || now.Before(h.first.Add(c.delay)) {
			return nil, h.due.Sub(now)
		}
		c.delayed.remove(h)
		c.delayed.pushBack(h)
	}
	return nil, c.delayed.front().due.Sub(now)
}

// lruList and qList are intrusive doubly linked lists of heads, with a sentinel.
type lruList struct{ root head }

func (l *lruList) init()              { l.root.lnext, l.root.lprev = &l.root, &l.root }
func (l *lruList) back() *head        { return l.prev(&l.root) }
func (l *lruList) prev(h *head) *head { return nilIf(h.lprev, &l.root) }
func (l *lruList) pushFront(h *head) {
	h.lprev, h.lnext = &l.root, l.root.lnext
	l.root.lnext.lprev = h
	l.root.lnext = h
}
func (l *lruList) remove(h *head) {
	h.lprev.lnext, h.lnext.lprev = h.lnext, h.lprev
	h.lprev, h.lnext = nil, nil
}

type qList struct{ root head }

func (l *qList) init()        { l.root.qnext, l.root.qprev = &l.root, &l.root }
func (l *qList) front() *head { return nilIf(l.root.qnext, &l.root) }
func (l *qList) pushBack(h *head) {
	h.qnext, h.qprev = &l.root, l.root.qprev
	l.root.qprev.qnext = h
	l.root.qprev = h
}
func (l *qList) remove(h *head) {
	h.qprev.qnext, h.qnext.qprev = h.qnext, h.qprev
	h.qprev, h.qnext = nil, nil
}

func nilIf(h, root *head) *head {
	if h == root {
		return nil
	}
	return h
}
