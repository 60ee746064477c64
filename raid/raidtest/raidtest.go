// Package raidtest provides members for testing the raid package, in the manner of httptest:
// an in-memory member, and a wrapper that injects faults into any member.
package raidtest

import (
	"errors"
	"fmt"
	"io"
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
