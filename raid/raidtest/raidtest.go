// Package raidtest provides members for testing the raid package, in the manner of httptest:
// an in-memory member, one with a volatile write cache that loses unsynced writes on a
// power cut, and a wrapper that injects faults into any member.
package raidtest

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/raid5d/raid5d/raid"
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

// Op is a kind of member operation a Fault applies to.
type Op int

const (
	OpRead Op = iota
	OpWrite
	OpSync
	OpTrim
)

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpTrim:
		return "trim"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// ErrInjected is what an injected fault returns.
var ErrInjected = errors.New("raidtest: injected fault")

// Fault describes operations that fail.
type Fault struct {
	Op Op
	// Off and Len select the operations that touch [Off, Off+Len) of the member;
	// Len == 0 selects every operation of kind Op.
	Off, Len int64
	// After lets this many selected operations succeed before the fault fires; from then on
	// every selected operation fails.
	After int
	// Drop (writes only) makes a firing fault report success without writing: a lost write.
	Drop bool
}

// Faulty wraps a member and fails the operations its faults select with ErrInjected.
// It is safe for concurrent use.
type Faulty struct {
	raid.Member
	mu     sync.Mutex // guards faults, seen, delay, done, hook
	faults []Fault
	seen   []int // per fault: selected operations so far
	delay  time.Duration
	done   [4]int // per Op: operations passed to the member
	hook   func(op Op, off int64)
}

// SetDelay adds latency d to every read and write (0: none).
func (f *Faulty) SetDelay(d time.Duration) {
	f.mu.Lock()
	f.delay = d
	f.mu.Unlock()
}

// Count returns how many operations of kind op reached the wrapped member (dropped writes and
// failed operations not counted).
func (f *Faulty) Count(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done[op]
}

// SetHook makes fn run before every operation, faulty or not, with the member's lock not
// held (nil: none): tests use it to look at the other members at the moment of an operation.
func (f *Faulty) SetHook(fn func(op Op, off int64)) {
	f.mu.Lock()
	f.hook = fn
	f.mu.Unlock()
}

// NewFaulty wraps m, with no faults yet.
func NewFaulty(m raid.Member) *Faulty { return &Faulty{Member: m} }

// Inject adds a fault.
func (f *Faulty) Inject(ft Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, ft)
	f.seen = append(f.seen, 0)
}

// Clear removes every fault.
func (f *Faulty) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults, f.seen = nil, nil
}

// errDropped marks a dropped write inside check.
var errDropped = errors.New("dropped")

func (f *Faulty) check(op Op, off, n int64) error {
	f.mu.Lock()
	hook, delay := f.hook, f.delay
	var err error
	for i, ft := range f.faults {
		if ft.Op != op || ft.Len > 0 && (off+n <= ft.Off || off >= ft.Off+ft.Len) {
			continue
		}
		f.seen[i]++
		if f.seen[i] > ft.After && err == nil {
			err = fmt.Errorf("%w: %s %s at %d", ErrInjected, op, f.Name(), off)
			if ft.Drop && op == OpWrite {
				err = errDropped
			}
		}
	}
	if err == nil {
		f.done[op]++
	}
	f.mu.Unlock()
	if hook != nil {
		hook(op, off)
	}
	if delay > 0 && (op == OpRead || op == OpWrite) {
		time.Sleep(delay)
	}
	return err
}

func (f *Faulty) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(OpRead, off, int64(len(p))); err != nil {
		return 0, err
	}
	return f.Member.ReadAt(p, off)
}

func (f *Faulty) WriteAt(p []byte, off int64) (int, error) {
	switch err := f.check(OpWrite, off, int64(len(p))); err {
	case nil:
	case errDropped:
		return len(p), nil
	default:
		return 0, err
	}
	return f.Member.WriteAt(p, off)
}

func (f *Faulty) Sync() error {
	if err := f.check(OpSync, 0, 0); err != nil {
		return err
	}
	return f.Member.Sync()
}

func (f *Faulty) Trim(off, length int64) error {
	if err := f.check(OpTrim, off, length); err != nil {
		return err
	}
	return f.Member.Trim(off, length)
}

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
