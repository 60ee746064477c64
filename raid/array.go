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

	"github.com/raid5d/raid5d/parity"
	"github.com/raid5d/raid5d/stripe"
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

	// members by role; nil for the missing role, if any. Fixed after assembly.
	members []Member
	missing int // the missing role, or -1

	// locks serialise writes, and reads that reconstruct, per stripe (hashed). A request
	// holds one at a time, in ascending stripe order; only Trim holds several (see lockSpan).
	// With a cache they also guard the stripe's cache head (see stripe.Cache).
	locks stripe.Locks

	// cache is the write-back stripe cache; nil without one (IOOptions.StripeCache < 0, or
	// read-only). Started by start, stopped by Close.
	cache  *stripe.Cache
	stable bool // IOOptions.StablePages
	// unsafeRef (tests only) makes WriteAt keep references to the caller's buffer as if it
	// were pinned, without any promise that it stays unchanged: the hazard stable pages avoid.
	unsafeRef bool
	missFn    func([]byte, stripe.Extent) error // a.readExtent, bound once
	ioq       []chan ioJob                      // by role: the cache's member I/O (memberio.go)
	ioWG      sync.WaitGroup                    // the member I/O goroutines
	ctr       counters

	scratch sync.Pool // *scratch: chunk-sized buffers for one stripe operation
	extents sync.Pool // *[]stripe.Extent

	// opMu: I/O methods hold it for reading, Close for writing; it guards closed.
	opMu   sync.RWMutex
	closed bool

	// sbMu serialises superblock updates and guards sbs, events, unclean.
	sbMu    sync.Mutex
	sbs     []*superblock // by role; nil for the missing role
	events  uint64
	unclean bool // assembled dirty: stays dirty on disk until a resync (later issue)
	// dirty is true once the superblocks say dirty; set under sbMu, read without it.
	dirty atomic.Bool
}

// scratch is the per-operation working memory of one stripe: one chunk-sized buffer per member
// slot (data chunks 0..D-1, then parity at D), allocated lazily, plus the shard and op slices.
type scratch struct {
	bufs   [][]byte
	shards [][]byte
	ops    []memberOp
}

func (a *Array) getScratch() *scratch { return a.scratch.Get().(*scratch) }

// putScratch returns s to the pool, dropping its references to callers' buffers.
func (a *Array) putScratch(s *scratch) {
	clear(s.shards)
	clear(s.ops[:cap(s.ops)])
	a.scratch.Put(s)
}

// buf returns slot i's buffer cut to n bytes.
func (s *scratch) buf(i int, chunk, n int64) []byte {
	if s.bufs[i] == nil {
		s.bufs[i] = make([]byte, chunk)
	}
	return s.bufs[i][:n]
}

func newArray(layout stripe.Layout, members []Member, sbs []*superblock, readOnly bool, log *slog.Logger, opts IOOptions) (*Array, error) {
	coder, err := parity.New(layout.DataMembers())
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var ref *superblock
	missing := -1
	for r, sb := range sbs {
		if sb == nil {
			missing = r
		} else if ref == nil {
			ref = sb
		}
	}
	a := &Array{
		layout:     layout,
		coder:      coder,
		dataOffset: ref.DataOffset,
		memberData: ref.DataSize,
		size:       ref.DataSize / layout.ChunkSize() * layout.StripeSize(),
		readOnly:   readOnly,
		log:        log,
		members:    members,
		missing:    missing,
		sbs:        sbs,
		events:     ref.Events,
	}
	n := layout.Members()
	a.scratch.New = func() any {
		return &scratch{bufs: make([][]byte, n), shards: make([][]byte, n), ops: make([]memberOp, 0, 2*n)}
	}
	a.extents.New = func() any { s := make([]stripe.Extent, 0, 2*n); return &s }
	a.missFn = a.readExtent
	a.stable = opts.StablePages
	if !readOnly && opts.StripeCache >= 0 {
		stripes := opts.StripeCache
		if stripes == 0 {
			stripes = DefaultCacheStripes(layout)
		}
		a.cache = stripe.NewCache(layout, coder, memberIO{a}, &a.locks, stripe.CacheOptions{
			Stripes: stripes, WriteBackDelay: opts.WriteBackDelay, WriteBackers: opts.WriteBackers, Logger: log,
		})
	}
	return a, nil
}

// start starts the array's background work (the cache's write-out goroutines); Close stops it.
func (a *Array) start() {
	if a.cache != nil {
		a.startIO()
		a.cache.Start(context.Background())
	}
}

// Layout returns the array's geometry.
func (a *Array) Layout() stripe.Layout { return a.layout }

// Size returns the array's size in bytes (the signature is go-nbd's backend.Backend's).
func (a *Array) Size() (int64, error) { return a.size, nil }

// State is the state of an array.
type State int

const (
	StateClean    State = iota // no writes since assembly or since the last clean shutdown
	StateActive                // written to: the superblocks say dirty until Close
	StateDegraded              // one member missing; reads rebuild its chunks from the others
	StateFailed                // two or more members missing: the data is not available
)

// MarshalText returns the state's name, for logs and JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s State) String() string {
	switch s {
	case StateClean:
		return "clean"
	case StateActive:
		return "active"
	case StateDegraded:
		return "degraded"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// MemberStatus describes one present member.
type MemberStatus struct {
	Path   string
	Role   int
	State  string // "active" (later issues add "faulty", "spare", "rebuilding")
	Events uint64
	Device UUID
}

// Status is a snapshot of an array's state.
type Status struct {
	UUID    UUID
	State   State
	Dirty   bool // the superblocks say dirty (writes since assembly, or an unclean shutdown)
	Unclean bool // assembled after an unclean shutdown: parity may be inconsistent until a resync
	Events  uint64
	Layout  stripe.Layout
	Size    int64
	Members []MemberStatus // present members, by role
	Missing []int          // roles without a member
}

// Status returns a snapshot of the array's state. It may be called concurrently with I/O.
func (a *Array) Status() Status {
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	st := Status{Events: a.events, Layout: a.layout, Size: a.size, Unclean: a.unclean}
	st.Dirty = a.dirty.Load() || a.unclean
	for r, m := range a.members {
		if m == nil {
			st.Missing = append(st.Missing, r)
			continue
		}
		st.UUID = a.sbs[r].ArrayUUID
		st.Members = append(st.Members, MemberStatus{Path: m.Name(), Role: r, State: "active", Events: a.events, Device: a.sbs[r].DeviceUUID})
	}
	switch {
	case len(st.Missing) > 1:
		st.State = StateFailed
	case len(st.Missing) == 1:
		st.State = StateDegraded
	case st.Dirty:
		st.State = StateActive
	default:
		st.State = StateClean
	}
	return st
}

// writeSuperblocks bumps the events counter, applies set to every present member's superblock
// and writes and syncs them all. The caller holds sbMu.
func (a *Array) writeSuperblocks(set func(*superblock)) error {
	a.events++
	now := time.Now()
	buf := make([]byte, SuperblockSize)
	var errs []error
	for r, sb := range a.sbs {
		if sb == nil {
			continue
		}
		sb.Events, sb.Updated = a.events, now
		set(sb)
		sb.encode(buf)
		m := a.members[r]
		if _, err := m.WriteAt(buf, SuperblockOffset); err != nil {
			errs = append(errs, memberErr(m, r, "write superblock", SuperblockOffset, err))
			continue
		}
		if err := m.Sync(); err != nil {
			errs = append(errs, memberErr(m, r, "sync superblock", -1, err))
		}
	}
	return errors.Join(errs...)
}

// markDirty records in the superblocks, durably, that writes are in flight. Every writing
// method calls it before issuing its first member write.
func (a *Array) markDirty() error {
	if a.dirty.Load() {
		return nil
	}
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	if a.dirty.Load() {
		return nil
	}
	if err := a.writeSuperblocks(func(sb *superblock) { sb.Dirty = true }); err != nil {
		return err
	}
	a.dirty.Store(true)
	return nil
}

// Flush makes every completed write durable: it writes out every dirty stripe of the cache,
// then fdatasyncs every member, concurrently. It also returns any error of a background
// write-out since the last Flush (the stripe stays dirty in the cache and is retried).
func (a *Array) Flush() error {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return ErrClosed
	}
	var err error
	if a.cache != nil {
		err = a.cache.Flush()
	}
	return errors.Join(err, a.syncMembers())
}

func (a *Array) syncMembers() error {
	errs := make([]error, len(a.members))
	var wg sync.WaitGroup
	for r, m := range a.members {
		if m == nil {
			continue
		}
		wg.Go(func() { errs[r] = memberErr(m, r, "sync", -1, m.Sync()) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Sync is Flush, under the name go-nbd's backend.Backend uses.
func (a *Array) Sync() error { return a.Flush() }

// Close waits for calls in flight, stops the cache's write-out, writes out every dirty stripe, flushes, marks the array clean in the superblocks (unless it
// was assembled dirty, see Status.Unclean, or read-only) and closes the members.
func (a *Array) Close() error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.closed {
		return ErrClosed
	}
	a.closed = true
	var errs []error
	if !a.readOnly {
		var err error
		if a.cache != nil {
			err = a.cache.Close()
			a.stopIO()
		}
		err = errors.Join(err, a.syncMembers())
		errs = append(errs, err)
		a.sbMu.Lock()
		if err == nil && a.dirty.Load() && !a.unclean {
			errs = append(errs, a.writeSuperblocks(func(sb *superblock) { sb.Dirty = false }))
			a.dirty.Store(false)
		}
		a.sbMu.Unlock()
	}
	for r, m := range a.members {
		if m != nil {
			errs = append(errs, memberErr(m, r, "close", -1, m.Close()))
		}
	}
	return errors.Join(errs...)
}
