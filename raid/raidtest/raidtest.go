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

// ErrPoweredOff is returned by a Volatile's methods between PowerCut and Reopen
// (faulty.ErrPoweredOff).
var ErrPoweredOff = faulty.ErrPoweredOff

// PageSize is the granularity of a Volatile's write cache: a page is lost or kept whole.
const PageSize = faulty.PageSize

// Volatile is an in-memory raid.Member with a volatile write cache, for crashing the whole
// machine in-process: faulty.Volatile (the implementation behind the daemon's volatile:
// specs) over a Mem that holds the stable contents. A write lands in the cache and reaches
// the stable contents only when Sync writes it there; PowerCut then throws the cache away —
// all of it, or a random subset of its pages, as a disk that reorders its writes may — and
// refuses every operation until Reopen. Close, too, drops what was not synced. Reads see the
// cache over the stable contents, like a real disk. It is safe for concurrent use.
type Volatile struct {
	*faulty.Volatile
	mem *Mem
}

var _ raid.Member = (*Volatile)(nil)

// NewVolatile returns a zero-filled Volatile of size bytes (a multiple of PageSize).
func NewVolatile(name string, size int64) *Volatile {
	mem := NewMem(name, size)
	return &Volatile{Volatile: faulty.NewVolatile(mem), mem: mem}
}

// PowerCut loses the write cache: each cached page reaches the stable contents with
// probability keep (0: none, as if every unsynced write was lost; in between: a random subset,
// in no particular order), drawn from rng; the rest is discarded. Afterwards every operation
// fails with ErrPoweredOff until Reopen. It returns how many pages were kept and lost.
func (v *Volatile) PowerCut(keep float64, rng *rand.Rand) (kept, lost int) {
	return PowerCut(keep, rng, v)
}

// PowerCut cuts the power of every member in vs at one instant, as faulty.PowerCut.
func PowerCut(keep float64, rng *rand.Rand, vs ...*Volatile) (kept, lost int) {
	fs := make([]*faulty.Volatile, len(vs))
	for i, v := range vs {
		fs[i] = v.Volatile
	}
	return faulty.PowerCut(keep, rng, fs...)
}

// Stable copies the stable contents at off into p: what a power cut with keep 0 would leave.
func (v *Volatile) Stable(p []byte, off int64) {
	v.mem.mu.RLock()
	defer v.mem.mu.RUnlock()
	copy(p, v.mem.data[off:])
}

// Reopen powers v on again (after PowerCut or Close), with its stable contents.
func (v *Volatile) Reopen() {
	v.mem.Reopen()
	v.Volatile.Reopen()
}
