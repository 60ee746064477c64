package raid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/parity"
	"github.com/raid5d/raid5d/raid/internal/bitmap"
	"github.com/raid5d/raid5d/raid/internal/journal"
	"github.com/raid5d/raid5d/stripe"
	"github.com/raid5d/raid5d/stripe/cache"
)

// nLocks is the size of the hashed table of stripe locks (a power of two): stripe s is guarded
// by locks.For(s), the mutex s % nLocks.
const nLocks = stripe.NumLocks

// Array is an assembled RAID-5 array. All its I/O methods may be called concurrently; Close
// must not be called concurrently with them (it waits for calls in flight, then refuses new ones).
type Array struct {
	layout     stripe.Layout
	coder      *parity.Coder
	dataOffset int64 // member offset of the data area
	memberData int64 // bytes of data area per member, a multiple of the chunk
	size       int64 // array bytes: stripes × StripeSize
	readOnly   bool
	log        *slog.Logger

	// roles is which member serves each role, what is usable, missing or lost, whether the
	// array has failed, and the write gate (roles.go). Read without a lock on every I/O.
	roles roleTable
	// records counts the member failures being recorded in the superblocks, which writes
	// wait for before they are acknowledged (record.go, awaitRecord).
	records failureRecords
	// view is the member list and superblock fields as the last Status (or assembly) read
	// them under sbMu: what Status answers with while sbMu is held for long.
	view atomic.Pointer[memberView]
	// clientOps counts client requests, so a rebuild or scrub can tell whether clients are busy.
	clientOps atomic.Uint64

	timeout      time.Duration // IOOptions.MemberTimeout; ≤ 0: none
	ticks        atomic.Int64  // the watchdog's ticks so far (hung.go): the slow-read check's clock
	readErrLimit int           // IOOptions.ReadErrorLimit
	// waitRemote is AssembleOptions.WaitRemote: how long openNew tries a remote member
	// that does not answer (at most maxManageWait).
	waitRemote time.Duration

	// locks serialise writes, and reads that reconstruct, per stripe (hashed, stripe.Locks);
	// they also guard the stripe's cache head. A request takes them one at a
	// time in ascending stripe order. Those that hold several — Trim of whole stripes, the
	// rebuild, scrub and resync batches, the cache's batch of whole stripes (writeFulls) —
	// take them in ascending lock order (LockSpan); the cache's eviction takes a second one
	// only with TryLock (stripe/cache's doc.go, # Locking). So none can deadlock.
	locks stripe.Locks

	// cache is the stripe cache, the only write path: with no heads when IOOptions.StripeCache
	// < 0 (every write written through), nil when read-only. Started by start, stopped by Close.
	cache    *cache.Cache
	stable   bool // IOOptions.StablePages
	mapReads bool // IOOptions.MappedReads
	mapWrite bool // IOOptions.MappedWrites
	// unsafeRef (tests only) makes WriteAt keep references to the caller's buffer as if it
	// were pinned, without any promise that it stays unchanged: the hazard stable pages avoid.
	unsafeRef bool
	missFn    func([]byte, stripe.Extent) error // a.readExtent, bound once
	ioq       []chan ioJob                      // by role: the cache's member I/O, then the read queue (memberio.go)
	ioWG      sync.WaitGroup                    // the member I/O goroutines
	ctr       counters

	scratch sync.Pool // *scratch: chunk-sized buffers for one stripe operation
	extents sync.Pool // *[]stripe.Extent

	// opMu: the I/O and management methods hold it for reading, Close for writing; it
	// guards closed.
	opMu   sync.RWMutex
	closed bool

	// Mapped reads (mapped.go): each successful ReadMapped holds mapMu for reading until its
	// ReleaseMapped; Close takes it for writing before the members (and their mappings) go.
	mapMu sync.RWMutex

	// mgmtMu serialises the management methods (Fail, Remove, AddSpare, Replace), so that what
	// one checks before a change (would it fail the array?) still holds when it makes it.
	// Taken before sbMu, never by the I/O paths.
	mgmtMu sync.Mutex

	// recordMu serialises the records of a full rebuild's position (recordRebuilt), so that
	// writers meeting its unrecorded window at once share one. Taken under stripe locks,
	// before sbMu.
	recordMu sync.Mutex

	// sbMu serialises superblock updates (record.go) and membership changes; it guards every
	// member's sb, spares, faulty, retired, events, unclean, uuid, the role table's changes
	// (roleTable.set, remove, recount) and the storing of view and dirty. It is never held
	// while taking a stripe lock (a failing member I/O takes it under one).
	sbMu    sync.Mutex
	spares  []*member // idle spares, in the order added
	faulty  []*member // faulty members no longer in roles, shown until removed or replaced
	retired []*member // dropped members, closed by Close (in-flight I/O may still use them)
	events  uint64
	uuid    UUID
	unclean bool // assembled dirty: stays dirty on disk until the resync has finished
	// eventsCleared is the superblocks' bitmap cleared mark (superblock.EventsCleared): the
	// events of the last update written with every role active. wholeRecorded says that the
	// last update was such a one: only then may the bitmap clear bits (bitmapMembers.Whole).
	eventsCleared uint64
	wholeRecorded atomic.Bool

	// resync is the set of regions whose parity may be stale after an unclean shutdown (nil
	// if the array was assembled clean); set before start, its flags cleared by the resync.
	// resyncPos is the resync's position in stripes: it moves past stripe s only under s's
	// lock. writeHole: assembled dirty and degraded, so those regions could not be resynced.
	resync    *resyncSet
	resyncPos atomic.Int64
	writeHole atomic.Bool
	// bm is the write-intent bitmap (internal/bitmap; bitmap.go is its bitmap.Members); nil if
	// the array has none.
	bm *bitmap.Bitmap
	// jr is the write journal (internal/journal; journal.go is its journal.Array and Device);
	// nil unless the consistency policy is journal.
	jr *journal.Journal

	// syncMu guards job, lastScrub, lastRebuild, lastResync, speedMin, speedMax and closing:
	// the background rebuild, scrub or resync (sync.go). Never held while taking sbMu or a
	// stripe lock.
	syncMu             sync.Mutex
	job                *syncJob
	lastScrub          *Progress
	lastRebuild        *Progress
	lastResync         *Progress
	speedMin, speedMax int64
	closing            bool
	bgWG               sync.WaitGroup // sync jobs, the bitmap's cleaner, work after a failure (Unpin, a rebuild's start)
	unpinOnce          sync.Once
	stopWatchdog       context.CancelFunc // stops the watchdog (hung.go); nil if none runs
	watchWG            sync.WaitGroup     // the watchdog: it runs until Close has written out and synced
	// dirty is true once the superblocks say dirty; set under sbMu, read without it.
	dirty atomic.Bool
	// auto is the running AutoReAdd's state (autoreadd.go), nil when none runs.
	auto atomic.Pointer[autoReAdder]
}

// stopWatch stops the watchdog, if it runs, and waits for it (and for a failure it is making).
func (a *Array) stopWatch() {
	if a.stopWatchdog != nil {
		a.stopWatchdog()
		a.watchWG.Wait()
	}
}

// lostInCache is Close's error for a failed array whose stripe cache still held writes it
// could not write out (err joins one error per stripe): one line, not one per stripe.
func lostInCache(err error) error {
	n := 1
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		n = len(j.Unwrap())
	}
	return fmt.Errorf("%w: writes to %d stripes acknowledged but not flushed were still in the stripe cache and are lost", ErrArrayFailed, n)
}

// scratch is the per-operation working memory of one stripe: one chunk-sized buffer per member
// slot (data chunks 0..D-1, then parity at D), allocated lazily, plus the shard slice.
type scratch struct {
	bufs   [][]byte
	shards [][]byte
}

func (a *Array) getScratch() *scratch { return a.scratch.Get().(*scratch) }

// putScratch returns s to the pool, dropping its references to callers' buffers.
func (a *Array) putScratch(s *scratch) {
	clear(s.shards)
	a.scratch.Put(s)
}

// buf returns slot i's buffer cut to n bytes.
func (s *scratch) buf(i int, chunk, n int64) []byte {
	if s.bufs[i] == nil {
		s.bufs[i] = aligned.Make(int(chunk)) // members read into it: aligned for direct I/O
	}
	return s.bufs[i][:n]
}

func newArray(layout stripe.Layout, roles []*member, spares []*member, readOnly bool, log *slog.Logger, opts IOOptions) (*Array, error) {
	coder, err := parity.New(layout.DataMembers())
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var ref *superblock
	for _, m := range append(roles[:len(roles):len(roles)], spares...) {
		if m != nil && (ref == nil || m.sb.Events > ref.Events) {
			ref = m.sb
		}
	}
	a := &Array{
		layout:        layout,
		coder:         coder,
		dataOffset:    ref.DataOffset,
		memberData:    ref.DataSize,
		size:          ref.DataSize / layout.ChunkSize() * layout.StripeSize(),
		readOnly:      readOnly,
		log:           log,
		spares:        spares,
		events:        ref.Events,
		eventsCleared: ref.EventsCleared,
		uuid:          ref.ArrayUUID,
		timeout:       opts.MemberTimeout,
		speedMin:      opts.SyncSpeedMin,
		speedMax:      opts.SyncSpeedMax,
	}
	if a.timeout == 0 {
		a.timeout = DefaultMemberTimeout
	}
	// The superblocks were last written with every role active (their cleared mark is
	// current); whether the roles still are is the role table's to say.
	a.wholeRecorded.Store(ref.EventsCleared != 0 && ref.EventsCleared == ref.Events)
	if ref.Features&featureBitmap != 0 && !readOnly {
		a.bm = newBitmap(a, ref.BitmapRegion)
	}
	a.readErrLimit = opts.ReadErrorLimit
	if a.readErrLimit == 0 {
		a.readErrLimit = DefaultReadErrorLimit
	}
	if a.speedMin <= 0 {
		a.speedMin = DefaultSyncSpeedMin
	}
	if a.speedMax <= 0 {
		a.speedMax = DefaultSyncSpeedMax
	}
	a.roles.init(len(roles), a.memberData/layout.ChunkSize(), a.timeout)
	a.roles.onFail = a.releasePins
	for r, m := range roles {
		if m != nil {
			a.roles.set(r, m)
		}
	}
	a.roles.recount()
	n := layout.Members()
	a.scratch.New = func() any {
		return &scratch{bufs: make([][]byte, n), shards: make([][]byte, n)}
	}
	a.extents.New = func() any { s := make([]stripe.Extent, 0, 2*n); return &s }
	a.missFn = a.readExtent
	a.stable = opts.StablePages
	a.mapReads = opts.MappedReads
	a.mapWrite = opts.MappedWrites
	if !readOnly { // the only write path; without caching (StripeCache < 0) it has no heads
		stripes := max(opts.StripeCache, 0)
		switch {
		case opts.StripeCacheBytes > 0:
			stripes = int(max(1, opts.StripeCacheBytes/(int64(n)*layout.ChunkSize())))
		case opts.StripeCache == 0:
			stripes = DefaultCacheStripes(layout)
		}
		wb := opts.WriteBackers
		if wb == 0 && a.remote() {
			wb = waitWriteBackers
		}
		a.cache = cache.New(layout, coder, cacheBackend{a}, &a.locks, cache.Options{
			Stripes: stripes, WriteBackDelay: opts.WriteBackDelay, WriteBackers: wb, Logger: log,
			MustReconstruct: a.needsRCW,
		})
	}
	return a, nil
}

// all returns every member the array tracks: by role, then faulty ones out of their role,
// then spares. The caller holds sbMu.
func (a *Array) all() []*member {
	var ms []*member
	for r := range a.roles.n() {
		if m := a.roles.member(r); m != nil {
			ms = append(ms, m)
		}
	}
	ms = append(ms, a.faulty...)
	return append(ms, a.spares...)
}

// start starts the array's background work (the cache's write-out goroutines); Close stops it.
func (a *Array) start() {
	a.sbMu.Lock()
	a.view.Store(a.readView())
	a.sbMu.Unlock()
	if a.cache != nil {
		if a.jr != nil { // a batch of whole stripes is one journal record: it must fit
			a.cache.LimitBatch(a.jr.MaxStripes(a.layout))
		}
		a.startIO()
		a.cache.Start(context.Background())
	}
	if a.timeout > 0 { // read-only too: nothing is written there, but its ticks time the reads
		ctx, cancel := context.WithCancel(context.Background())
		a.stopWatchdog = cancel
		a.watchWG.Go(func() { a.watchdog(ctx) })
	}
	if !a.readOnly {
		a.maybeRebuild()
		a.maybeResync()
		if a.bm != nil {
			a.bgWG.Go(a.bm.Run)
		}
	}
}

// Layout returns the array's geometry.
func (a *Array) Layout() stripe.Layout { return a.layout }

// Size returns the array's size in bytes (the signature is go-nbd's backend.Backend's).
func (a *Array) Size() (int64, error) { return a.size, nil }

// Flush makes every completed write durable: it writes out every dirty stripe of the cache,
// then fdatasyncs every member, concurrently. It also returns any error of a background
// write-out since the last Flush (the stripe stays dirty in the cache and is retried).
func (a *Array) Flush() error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return ErrClosed
	}
	a.clientOps.Add(1)
	var err error
	if a.cache != nil {
		err = a.cache.Flush()
	}
	return a.awaitDurable(errors.Join(err, a.syncMembers()))
}

// syncMembers fdatasyncs every working member, concurrently. A member whose sync fails is
// marked faulty; an error is returned only if that leaves the array failed: ErrArrayFailed,
// with the syncs' *MemberErrors. A failed array returns ErrArrayFailed even if every sync it
// tried succeeded.
func (a *Array) syncMembers() error {
	if err := a.syncWorking(); err != nil {
		return err
	}
	// A failed array has nothing left to sync for its lost roles: a Flush (or FUA write)
	// must not succeed then, even when every member was already marked faulty before it
	// began and so nothing in syncWorking failed.
	if a.roles.failed() {
		return fmt.Errorf("%w: nothing can be made durable", ErrArrayFailed)
	}
	return nil
}

// syncWorking is syncMembers without the verdict on a failed array: Close syncs what is left
// of one (its failure was reported when it happened).
func (a *Array) syncWorking() error {
	var ms []*member
	var roles []int
	for r := range a.roles.n() {
		if m := a.roles.working(r); m != nil {
			ms, roles = append(ms, m), append(roles, r)
		}
	}
	// Concurrently, each bounded by the member timeout: a member whose sync does not return
	// in time is failed like one whose sync fails, so a FLUSH does not wait for it for ever.
	errs := a.eachMember(ms, func(_ int, m *member) error { return syncData(m.Member) })
	for i, err := range errs {
		errs[i] = nil
		if err == nil {
			continue
		}
		merr := memberErr(ms[i], roles[i], "sync", -1, err)
		a.fail(ms[i], merr)
		if a.roles.failed() { // decided by fail's recount
			errs[i] = merr
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: syncing the members: %w", ErrArrayFailed, err) // TestFlushSyncFailsArray
	}
	return nil
}

// Sync is Flush, under the name go-nbd's backend.Backend uses.
func (a *Array) Sync() error { return a.Flush() }

// Close waits for calls in flight, stops the cache's write-out, writes out every dirty stripe,
// flushes, checkpoints the write journal (if any: it is empty afterwards), marks the array
// clean in the superblocks (unless it was assembled dirty, see Status.Unclean, or read-only)
// and closes the members and the journal.
func (a *Array) Close() error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.closed {
		return ErrClosed
	}
	a.closed = true
	if a.jr != nil {
		a.jr.Stop() // writers that find the ring full checkpoint by themselves meanwhile
	}
	a.stopAllSync()
	var errs []error
	if !a.readOnly {
		var err error
		if a.cache != nil {
			err = a.cache.Close()
			a.stopIO()
			if err != nil && a.roles.failed() {
				err = lostInCache(err)
			}
		}
		err = errors.Join(err, a.syncWorking())
		// Nothing below may run on a failed array, and from here on only the steps below can
		// fail a member, each reporting it in its error: the watchdog (which watched the
		// write-outs and the final sync) stops first, so that no failure overtakes a check.
		a.stopWatch()
		if err == nil && a.jr != nil && !a.jr.Missing() && !a.roles.failed() {
			// Everything is written and synced: nothing is left to replay.
			err = a.jr.Checkpoint()
		}
		errs = append(errs, err)
		if err == nil && a.bm != nil && !a.roles.failed() {
			// Everything is written and synced: no region needs its bit (but those still
			// waiting for the resync). Not under sbMu: a member whose bitmap write fails is
			// failed, which takes sbMu (TestCloseBitmapWriteFails).
			err = a.bm.ClearAll()
			errs = append(errs, err)
		}
		a.sbMu.Lock()
		if err == nil && a.dirty.Load() && !a.unclean && !a.roles.failed() {
			errs = append(errs, a.writeSuperblocks(func(sb *superblock) { sb.Dirty = false }))
			a.dirty.Store(false)
		}
		a.sbMu.Unlock()
	}
	a.stopWatch()
	a.closeMapped() // no reply still reads a member's mapping
	a.sbMu.Lock()
	for _, m := range append(a.all(), a.retired...) {
		errs = append(errs, memberErr(m, m.sb.Role, "close", -1, m.Close()))
	}
	a.sbMu.Unlock()
	if a.jr != nil {
		if err := a.jr.Close(); err != nil {
			errs = append(errs, fmt.Errorf("raid: closing the journal %s: %w", a.jr.Path(), err))
		}
	}
	return errors.Join(errs...)
}
