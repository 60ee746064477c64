package faulty

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/raid5d/raid5d/raid/member"
)

// volatilePage is the granularity of a volatile member's write cache: a page reaches the file
// whole or not at all, as a 4 KiB sector of a disk that does not tear its sectors.
const volatilePage = 4096

// Volatile keeps every write (and trim) in the process's memory, in whole pages, until a
// Sync; Sync then writes the batch to the member underneath page by page in a random order and
// fdatasyncs it. Killing the process therefore loses exactly what a power cut loses on a disk
// with a volatile write cache that reorders its writes: every write not synced, and of a Sync
// in progress any subset of its pages. Close without a Sync also drops the unsynced pages. It
// is a testing tool (faulty:PATH?volatile), never a way to run an array: the cache grows
// with the writes between syncs, and a page written in a Sync batch costs a pwrite of its own.
// Reads see the cache over the batch being synced over the file, like a disk. Safe for
// concurrent use.
type Volatile struct {
	member.Member // the member underneath: holds what survives a kill

	syncMu sync.Mutex // serialises Sync and Close; guards rng
	rng    *rand.Rand

	mu sync.RWMutex // guards cache, flushing, closed
	// cache holds the pages written since the last Sync began; flushing the batch a running
	// Sync is writing out (nil when none runs). A page is a volatilePage slice (shorter at the
	// end of the member), or nil for a page trimmed whole.
	cache    map[int64][]byte
	flushing map[int64][]byte
	closed   bool
}

// ErrClosed is returned by a Volatile's methods after Close.
var ErrClosed = errors.New("faulty: volatile member is closed")

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
	return min(volatilePage, v.Size()-pg*volatilePage)
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
		pg, in := (off+n)/volatilePage, (off+n)%volatilePage
		k := min(volatilePage-in, int64(len(p))-n)
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
		pg, in := (off+n)/volatilePage, (off+n)%volatilePage
		k := min(volatilePage-in, length-n)
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
				if _, err := v.Member.ReadAt(c, pg*volatilePage); err != nil {
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
// not yet written stay cached (unless rewritten since) and the error is returned.
func (v *Volatile) Sync() error {
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return fmt.Errorf("%w: sync %s", ErrClosed, v.Name())
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
		if c := batch[pg]; c != nil {
			_, err = v.Member.WriteAt(c, pg*volatilePage)
		} else {
			err = v.Member.Trim(pg*volatilePage, v.pageLen(pg))
		}
		if err != nil {
			break
		}
		done++
	}
	if err == nil {
		err = v.Member.Sync()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.flushing = nil
	if err != nil {
		for _, pg := range pages[done:] {
			if _, rewritten := v.cache[pg]; !rewritten {
				v.cache[pg] = batch[pg]
			}
		}
		return fmt.Errorf("faulty: volatile member %s: sync: %w", v.Name(), err)
	}
	return nil
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
