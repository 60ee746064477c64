package cache

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
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
	// Stripes is the capacity in stripes. Memory: Stripes × members × chunk bytes (every head
	// has a buffer per data chunk and one for parity), allocated as heads are first used. 0
	// means no heads, no write-back: every partial write is written through (into a spare head
	// and out to the members, with its parity, before Write returns), whole stripes as always,
	// and reads go straight to the members.
	Stripes int
	// WriteBackDelay is how long a partial stripe waits for later writes to fill it before it
	// is written out (up to a tenth more: the write-out goroutines take the heads that fell due
	// together); 0 means DefaultWriteBackDelay. Full stripes are written out at once, and so
	// is everything once more than half the heads are dirty, until no more than 3/8 are.
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
	FullStripeWrites uint64 // stripes written whole, parity from new data alone: no reads
	RMWWrites        uint64 // partial write-outs by read-modify-write
	RCWWrites        uint64 // partial write-outs by reconstruct-write (none read when every unit was up to date)
	CopiedBytes      uint64 // bytes of writes copied into heads
	Hits             uint64 // read extents served from the cache alone (none without heads)
	Misses           uint64 // read extents that needed member reads (none counted without heads)
	Evictions        uint64 // clean heads reused for another stripe
	WriteThroughs    uint64 // partial writes written synchronously: no head was free (all, without heads)
}

// Cache is a write-back RAID-5 stripe cache (see the package doc). All methods may be called
// concurrently.
type Cache struct {
	layout  stripe.Layout
	coder   *parity.Coder
	backend Backend
	locks   *stripe.Locks
	delay   time.Duration
	nwb     int
	log     *slog.Logger
	mustRC  func(s int64) bool // Options.MustReconstruct, or nil
	nd      int                // data chunks per stripe
	chunk   int64              // chunk size
	upc     int                // units per chunk
	cap     int

	mu      sync.Mutex // guards heads, lru, free, delayed, urgent, queued, timing, pressed, err, and heads' bindings and links
	heads   map[int64]*head
	lru     lruList // bound heads, most recently used first
	free    []*head // unbound heads
	delayed qList   // dirty heads waiting for WriteBackDelay, oldest first
	urgent  qList   // heads dirty in every unit, to be written out at once
	queued  int     // heads in delayed or urgent
	timing  bool    // a write-out goroutine sleeps until the next delayed head is due (next)
	pressed bool    // delayed heads go out before they are due (pressedLocked)
	err     error   // first background write-out error since the last Flush

	kick chan struct{} // wakes a write-out goroutine
	stop context.CancelFunc
	wg   sync.WaitGroup

	work    freeList  // *workspace
	spare   freeList  // *head, unbound, for write-through
	batches sync.Pool // *batch
	nBatch  int64     // most stripes in one batch (writeFulls); < 2: no batches
	nJoin   int64     // most whole stripes in a batch a head joins (writeJoined): nBatch, or nBatch-1 under LimitBatch

	full, rmw, rcw, copied, hits, misses, evictions, through atomic.Uint64
	// noRefs, set by Unpin, makes fill copy every unit instead of referencing a pinned buffer.
	noRefs atomic.Bool

	expected [expectSlots]expectSlot // writes announced by Expect, not yet arrived: expect.go
}

// New returns a cache for the array of layout, whose parity coder is coder, reaching the
// members through m and locking stripes in locks. Start starts its write-out goroutines.
func New(layout stripe.Layout, coder *parity.Coder, m Backend, locks *stripe.Locks, opts Options) *Cache {
	c := &Cache{
		layout: layout, coder: coder, backend: m, locks: locks,
		delay: opts.WriteBackDelay, nwb: opts.WriteBackers, log: opts.Logger, mustRC: opts.MustReconstruct,
		nd: layout.DataMembers(), chunk: layout.ChunkSize(), upc: int(layout.ChunkSize() / stripe.UnitSize),
		cap:   max(opts.Stripes, 0),
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
	c.nJoin = c.nBatch // the joined head needs no scratch: a batch's memory bound holds
	c.batches.New = func() any {
		n, m := c.nBatch, int64(layout.Members())
		return &batch{
			// Written from by members: aligned for direct I/O.
			data: aligned.Make(int(n * layout.StripeSize())), par: aligned.Make(int(n * c.chunk)),
			ops: make([]stripe.MemberOp, 0, n*m), vecs: make([][]byte, 0, n*m), shards: make([][]byte, c.nd+1),
			lead: make([][]byte, 0, m*int64(c.upc)), leadAt: make([]int, 2*m), flat: make([][]byte, 0, m*(int64(c.upc)+n)),
		}
	}
	return c
}

// LimitBatch bounds the stripes written together in one batch (one Backend.Do) to n, a head
// joined to a batch (writeJoined) included; n < 2 turns batches off. A Backend that must hold a batch's member writes in one bounded record (the
// array's write journal) calls it before the cache is first used.
func (c *Cache) LimitBatch(n int64) {
	c.nBatch = min(c.nBatch, n)
	c.nJoin = min(c.nJoin, n-1) // a joined head counts
}

// Capacity returns the capacity in stripes.
func (c *Cache) Capacity() int { return c.cap }

// Start starts the write-out goroutines; they run until ctx is done or Close. A cache of no
// heads has nothing to write out and starts none.
func (c *Cache) Start(ctx context.Context) {
	if c.cap == 0 {
		return
	}
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
