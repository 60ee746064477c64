package faulty

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/raid5d/raid5d/raid/member"
)

// PageSize is the granularity of a Volatile's write cache: a page reaches the member
// underneath whole or not at all, as a 4 KiB sector of a disk that does not tear its sectors.
const PageSize = 4096

// Volatile keeps every write (and trim) in the process's memory, in whole pages, until a
// Sync; Sync then writes the batch to the member underneath page by page in a random order and
// fdatasyncs it. Killing the process therefore loses exactly what a power cut loses on a disk
// with a volatile write cache that reorders its writes: every write not synced, and of a Sync
// in progress any subset of its pages. Close without a Sync also drops the unsynced pages. It
// is a testing tool (faulty:PATH?volatile), never a way to run an array: the cache grows
// with the writes between syncs, and a page written in a Sync batch costs a pwrite of its own.
// Reads see the cache over the batch being synced over the file, like a disk.
//
// In-process, PowerCut does what a kill does, for several members at one instant, and may keep
// a random subset of the unsynced pages; Reopen powers the member on again. Safe for
// concurrent use.
type Volatile struct {
	member.Member // the member underneath: holds what survives a kill

	syncMu sync.Mutex // serialises Sync and Close; guards rng
	rng    *rand.Rand

	// mu guards cache, flushing, closed, off and syncs. A Sync holds it for reading while it
	// writes a page to the member underneath, so that PowerCut (holding it) falls between two.
	mu sync.RWMutex
	// cache holds the pages written since the last Sync began; flushing the batch a running
	// Sync is writing out (nil when none runs). A page is a PageSize slice (shorter at the
	// end of the member), or nil for a page trimmed whole.
	cache    map[int64][]byte
	flushing map[int64][]byte
	closed   bool
	off      bool // powered off (PowerCut) until Reopen
	syncs    int  // Syncs that succeeded
}

var (
	// ErrClosed is returned by a Volatile's methods after Close.
	ErrClosed = errors.New("faulty: volatile member is closed")
	// ErrPoweredOff is returned by a Volatile's methods between PowerCut and Reopen.
	ErrPoweredOff = errors.New("faulty: member is powered off")
)

// NewVolatile wraps m in a volatile write cache.
func NewVolatile(m member.Member) *Volatile {
	return &Volatile{
		Member: m,
		rng:    rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		cache:  map[int64][]byte{},
	}
}

// Unwrap returns the member underneath (member.Wrapper).
func (v *Volatile) Unwrap() member.Member { return v.Member }

// pageLen is the length of page pg (the last page of a member may be short).
func (v *Volatile) pageLen(pg int64) int64 {
	return min(PageSize, v.Size()-pg*PageSize)
}

// lookup returns the newest unsynced contents of page pg (nil and true for a trimmed page), or
// false if the file holds it. v.mu is held.
func (v *Volatile) lookup(pg int64) ([]byte, bool) {
	if c, ok := v.cache[pg]; ok {
		return c, true
	}
	c, ok := v.flushing[pg]
	return c, ok
}

func (v *Volatile) checkRange(op string, off, n int64) error {
	if v.closed {
		return fmt.Errorf("%w: %s %s at %d", ErrClosed, op, v.Name(), off)
	}
	if v.off {
		return fmt.Errorf("%w: %s %s at %d", ErrPoweredOff, op, v.Name(), off)
	}
	if off < 0 || n < 0 || off+n > v.Size() {
		return fmt.Errorf("faulty: volatile member %s: %s [%d, %d) outside member of %d bytes", v.Name(), op, off, off+n, v.Size())
	}
	return nil
}

// ReadAt reads the cache over the batch being synced over the file; runs of pages that only
// the file holds are read with one call.
func (v *Volatile) ReadAt(p []byte, off int64) (int, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if err := v.checkRange("read", off, int64(len(p))); err != nil {
		return 0, err
	}
	run := int64(0) // bytes of p from here back that the file holds, not read yet
	readRun := func(end int64) error {
		if run == 0 {
			return nil
		}
		_, err := v.Member.ReadAt(p[end-run:end], off+end-run)
		run = 0
		return err
	}
	for n := int64(0); n < int64(len(p)); {
		pg, in := (off+n)/PageSize, (off+n)%PageSize
		k := min(PageSize-in, int64(len(p))-n)
		c, ok := v.lookup(pg)
		if !ok {
			run += k
			n += k
			continue
		}
		if err := readRun(n); err != nil {
			return 0, err
		}
		if c == nil {
			clear(p[n : n+k])
		} else {
			copy(p[n:n+k], c[in:])
		}
		n += k
	}
	if err := readRun(int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// put writes p (nil: zeroes) into the cache at off; v.mu is held for writing.
func (v *Volatile) put(p []byte, off, length int64) error {
	for n := int64(0); n < length; {
		pg, in := (off+n)/PageSize, (off+n)%PageSize
		k := min(PageSize-in, length-n)
		whole := in == 0 && k == v.pageLen(pg)
		if whole && p == nil {
			v.cache[pg] = nil // trimmed whole
			n += k
			continue
		}
		c, cached := v.cache[pg]
		if c == nil { // absent, or trimmed whole: start from the newest contents
			c = make([]byte, v.pageLen(pg))
			switch old, ok := v.lookup(pg); {
			case cached || whole: // trimmed (zeroes), or about to be overwritten whole
			case ok:
				if old != nil {
					copy(c, old)
				}
			default:
				if _, err := v.Member.ReadAt(c, pg*PageSize); err != nil {
					return err
				}
			}
			v.cache[pg] = c
		}
		if p != nil {
			copy(c[in:in+k], p[n:])
		} else {
			clear(c[in : in+k])
		}
		n += k
	}
	return nil
}

// WriteAt puts p in the cache: it reaches the file at the next Sync, or never.
func (v *Volatile) WriteAt(p []byte, off int64) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.checkRange("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	if err := v.put(p, off, int64(len(p))); err != nil {
		return 0, fmt.Errorf("faulty: volatile member %s: write at %d: reading the page underneath: %w", v.Name(), off, err)
	}
	return len(p), nil
}

// Trim zeroes [off, off+length) in the cache: as volatile as a write. Pages trimmed whole
// are punched out of the file (Member.Trim) when synced.
func (v *Volatile) Trim(off, length int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.checkRange("trim", off, length); err != nil {
		return err
	}
	if err := v.put(nil, off, length); err != nil {
		return fmt.Errorf("faulty: volatile member %s: trim at %d: reading the page underneath: %w", v.Name(), off, err)
	}
	return nil
}

// Sync writes the pages cached so far to the file in a random order, then fdatasyncs it.
// Writes that arrive meanwhile go to the next batch. If a page cannot be written, the pages
// not yet written stay cached (unless rewritten since) and the error is returned; if the
// power is cut meanwhile (PowerCut), the rest of the batch is PowerCut's to keep or lose.
func (v *Volatile) Sync() error {
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	v.mu.Lock()
	if err := v.checkRange("sync", 0, 0); err != nil {
		v.mu.Unlock()
		return err
	}
	batch := v.cache
	v.cache, v.flushing = map[int64][]byte{}, batch
	v.mu.Unlock()

	pages := make([]int64, 0, len(batch))
	for pg := range batch {
		pages = append(pages, pg)
	}
	slices.Sort(pages) // map order is not a seeded shuffle; this and rng make one
	v.rng.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
	var err error
	done := 0
	for _, pg := range pages {
		if err = v.powered(func() error {
			if c := batch[pg]; c != nil {
				_, err := v.Member.WriteAt(c, pg*PageSize)
				return err
			}
			return v.Member.Trim(pg*PageSize, v.pageLen(pg))
		}); err != nil {
			break
		}
		done++
	}
	if err == nil {
		err = v.powered(v.Member.Sync)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.flushing = nil
	switch {
	case v.off:
		return fmt.Errorf("%w: sync %s", ErrPoweredOff, v.Name())
	case err != nil:
		for _, pg := range pages[done:] {
			if _, rewritten := v.cache[pg]; !rewritten {
				v.cache[pg] = batch[pg]
			}
		}
		return fmt.Errorf("faulty: volatile member %s: sync: %w", v.Name(), err)
	}
	v.syncs++
	return nil
}

// powered runs f, a write to the member underneath, unless the power is off.
func (v *Volatile) powered(f func() error) error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.off || v.closed {
		return ErrPoweredOff
	}
	return f()
}

// Syncs reports how many Syncs succeeded.
func (v *Volatile) Syncs() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.syncs
}

// Unsynced returns how many pages are not yet known to be on the member underneath: cached,
// or in a Sync's batch.
func (v *Volatile) Unsynced() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.cache) + len(v.flushing)
}

// PowerCut cuts the power of every member in vs at one instant (all their locks held at
// once, so no I/O reaches one after another lost power): each page not yet on the member
// underneath (cached, or in a running Sync's batch and not yet written) reaches it with
// probability keep, drawn from rng (0: none, as if every unsynced write was lost; in between:
// a random subset, in no particular order), and the rest is lost. Afterwards every operation
// fails with ErrPoweredOff until Reopen. It returns how many pages were kept and lost. A
// machine's crash is this; cutting members one by one would let the array notice the first
// and record it on the others.
func PowerCut(keep float64, rng *rand.Rand, vs ...*Volatile) (kept, lost int) {
	for _, v := range vs {
		v.mu.Lock()
	}
	for _, v := range vs {
		k, l := v.cut(keep, rng)
		kept, lost = kept+k, lost+l
	}
	for _, v := range vs {
		v.mu.Unlock()
	}
	return kept, lost
}

// cut is PowerCut for v; v.mu is held. A batch page is written before a cached one, which is
// newer.
func (v *Volatile) cut(keep float64, rng *rand.Rand) (kept, lost int) {
	for _, pages := range []map[int64][]byte{v.flushing, v.cache} {
		for pg, c := range pages {
			if keep <= 0 || rng.Float64() >= keep {
				lost++
				continue
			}
			var err error
			if c != nil {
				_, err = v.Member.WriteAt(c, pg*PageSize)
			} else {
				err = v.Member.Trim(pg*PageSize, v.pageLen(pg))
			}
			if err != nil {
				panic(fmt.Sprintf("faulty: power cut of %s: keeping page %d: %v", v.Name(), pg, err))
			}
			kept++
		}
	}
	v.cache, v.flushing, v.off = map[int64][]byte{}, nil, true
	return kept, lost
}

// Reopen powers v on again after PowerCut, or makes it usable again after Close (the member
// underneath must be open again too: raidtest.Volatile reopens its in-memory one), with what
// the member underneath holds.
func (v *Volatile) Reopen() {
	v.mu.Lock()
	v.off, v.closed = false, false
	if v.cache == nil {
		v.cache = map[int64][]byte{}
	}
	v.mu.Unlock()
}

// Close drops the pages not synced, as a power cut would, and closes the member underneath.
func (v *Volatile) Close() error {
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return fmt.Errorf("%w: close %s", ErrClosed, v.Name())
	}
	v.closed, v.cache = true, nil
	return v.Member.Close()
}
