// Package raidtest provides members for testing the raid package, in the manner of httptest:
// an in-memory member, one with a volatile write cache that loses unsynced writes on a
// power cut, and (from raid/member/faulty) a wrapper that injects faults into any member.
package raidtest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member/faulty"
)

// Mem is an in-memory raid.Member. It is safe for concurrent use.
type Mem struct {
	name string
	mu   sync.RWMutex // guards data, closed, syncs
	data []byte
	// counters, for tests that check what the array did
	closed bool
	syncs  int
}

var _ raid.Member = (*Mem)(nil)

// ErrClosed is returned by a Mem's methods after Close.
var ErrClosed = errors.New("raidtest: member is closed")

// NewMem returns a zero-filled in-memory member of size bytes.
func NewMem(name string, size int64) *Mem {
	return &Mem{name: name, data: make([]byte, size)}
}

func (m *Mem) Name() string { return m.name }
func (m *Mem) Size() int64  { return int64(len(m.data)) }

// Bytes returns the member's contents (the live slice: do not use it concurrently with writes).
func (m *Mem) Bytes() []byte { return m.data }

// Reopen makes a closed Mem usable again, contents intact, as if the file were opened anew.
func (m *Mem) Reopen() {
	m.mu.Lock()
	m.closed = false
	m.mu.Unlock()
}

// Syncs reports how many times Sync was called.
func (m *Mem) Syncs() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.syncs
}

func (m *Mem) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, ErrClosed
	}
	if off < 0 || off > int64(len(m.data)) {
		return 0, fmt.Errorf("raidtest: read at %d outside member of %d bytes", off, len(m.data))
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *Mem) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	if off < 0 || off+int64(len(p)) > int64(len(m.data)) {
		return 0, fmt.Errorf("raidtest: write [%d, %d) outside member of %d bytes", off, off+int64(len(p)), len(m.data))
	}
	return copy(m.data[off:], p), nil
}

func (m *Mem) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.syncs++
	return nil
}

// Trim zeroes [off, off+length).
func (m *Mem) Trim(off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if off < 0 || length < 0 || off+length > int64(len(m.data)) {
		return fmt.Errorf("raidtest: trim [%d, %d) outside member of %d bytes", off, off+length, len(m.data))
	}
	clear(m.data[off : off+length])
	return nil
}

func (m *Mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	return nil
}

// Fault injection is raid/member/faulty's, the implementation behind the daemon's faulty:
// member specs too.
type (
	// Faulty wraps a member and fails the operations its faults select (faulty.Member).
	Faulty = faulty.Member
	// Fault describes operations that fail (faulty.Fault).
	Fault = faulty.Fault
	// Op is a kind of member operation a Fault applies to (faulty.Op).
	Op = faulty.Op
)

const (
	OpRead  = faulty.OpRead
	OpWrite = faulty.OpWrite
	OpSync  = faulty.OpSync
	OpTrim  = faulty.OpTrim
)

// ErrInjected is what an injected fault returns (faulty.ErrInjected).
var ErrInjected = faulty.ErrInjected

// NewFaulty wraps m, with no faults yet (faulty.New).
func NewFaulty(m raid.Member) *Faulty { return faulty.New(m) }

// ErrPoweredOff is returned by a Volatile's methods between PowerCut and Reopen.
var ErrPoweredOff = errors.New("raidtest: member is powered off")

// PageSize is the granularity of a Volatile's write cache: a page is lost or kept whole.
const PageSize = 4096

// Volatile is an in-memory raid.Member with a volatile write cache, for crashing the whole
// machine in-process: a write lands in the cache (whole pages, copy-on-write from the stable
// contents) and reaches the stable contents only when Sync runs; PowerCut then throws the
// cache away — all of it, or a random subset of its pages, as a disk that reorders its writes
// may — and refuses every operation until Reopen. Reads see the cache over the stable
// contents, like a real disk. It is safe for concurrent use.
type Volatile struct {
	name string
	size int64
	mu   sync.Mutex // guards everything below
	// stable holds what survives a power cut; cache the pages written since the last Sync.
	stable []byte
	cache  map[int64][]byte
	off    bool // powered off (PowerCut) or closed
	syncs  int
}

var _ raid.Member = (*Volatile)(nil)

// NewVolatile returns a zero-filled Volatile of size bytes (a multiple of PageSize).
func NewVolatile(name string, size int64) *Volatile {
	return &Volatile{name: name, size: size, stable: make([]byte, size), cache: map[int64][]byte{}}
}

func (v *Volatile) Name() string { return v.name }
func (v *Volatile) Size() int64  { return v.size }

func (v *Volatile) check(off, n int64) error {
	if v.off {
		return ErrPoweredOff
	}
	if off < 0 || n < 0 || off+n > v.size {
		return fmt.Errorf("raidtest: [%d, %d) outside member of %d bytes", off, off+n, v.size)
	}
	return nil
}

func (v *Volatile) ReadAt(p []byte, off int64) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	for n := int64(0); n < int64(len(p)); {
		pg, in := (off+n)/PageSize, (off+n)%PageSize
		k := min(PageSize-in, int64(len(p))-n)
		if c := v.cache[pg]; c != nil {
			copy(p[n:n+k], c[in:])
		} else {
			copy(p[n:n+k], v.stable[off+n:])
		}
		n += k
	}
	return len(p), nil
}

// write puts p (nil: zeroes) at off into the cache; v.mu is held.
func (v *Volatile) write(p []byte, off, length int64) {
	for n := int64(0); n < length; {
		pg, in := (off+n)/PageSize, (off+n)%PageSize
		k := min(PageSize-in, length-n)
		c := v.cache[pg]
		if c == nil {
			c = make([]byte, PageSize)
			copy(c, v.stable[pg*PageSize:])
			v.cache[pg] = c
		}
		if p != nil {
			copy(c[in:in+k], p[n:])
		} else {
			clear(c[in : in+k])
		}
		n += k
	}
}

func (v *Volatile) WriteAt(p []byte, off int64) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	v.write(p, off, int64(len(p)))
	return len(p), nil
}

// Trim zeroes [off, off+length) in the cache: it is as volatile as a write.
func (v *Volatile) Trim(off, length int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.check(off, length); err != nil {
		return err
	}
	v.write(nil, off, length)
	return nil
}

// Sync moves every cached page to the stable contents.
func (v *Volatile) Sync() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.off {
		return ErrPoweredOff
	}
	for pg, c := range v.cache {
		copy(v.stable[pg*PageSize:], c)
	}
	clear(v.cache)
	v.syncs++
	return nil
}

// Syncs reports how many times Sync succeeded.
func (v *Volatile) Syncs() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.syncs
}

func (v *Volatile) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.off {
		return ErrPoweredOff
	}
	v.off = true
	return nil
}

// PowerCut loses the write cache: each cached page reaches the stable contents with
// probability keep (0: none, as if every unsynced write was lost; in between: a random subset,
// in no particular order), drawn from rng; the rest is discarded. Afterwards every operation
// fails with ErrPoweredOff until Reopen. It returns how many pages were kept and lost.
func (v *Volatile) PowerCut(keep float64, rng *rand.Rand) (kept, lost int) {
	return PowerCut(keep, rng, v)
}

// PowerCut cuts the power of every member in vs at one instant (all their locks held at
// once, so no I/O reaches one after another lost power): as Volatile.PowerCut on each. A
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

// cut is PowerCut for v; v.mu is held.
func (v *Volatile) cut(keep float64, rng *rand.Rand) (kept, lost int) {
	for pg, c := range v.cache {
		if keep > 0 && rng.Float64() < keep {
			copy(v.stable[pg*PageSize:], c)
			kept++
		} else {
			lost++
		}
	}
	clear(v.cache)
	v.off = true
	return kept, lost
}

// Unsynced returns how many pages the write cache holds.
func (v *Volatile) Unsynced() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.cache)
}

// Stable copies the stable contents at off into p: what a power cut with keep 0 would leave.
func (v *Volatile) Stable(p []byte, off int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	copy(p, v.stable[off:])
}

// Reopen powers v on again (after PowerCut or Close), with its stable contents.
func (v *Volatile) Reopen() {
	v.mu.Lock()
	v.off = false
	v.mu.Unlock()
}
