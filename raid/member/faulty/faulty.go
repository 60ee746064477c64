package faulty

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/raid/member"
)

// ErrInjected is what an injected fault returns, wrapped with the operation, member and offset.
// It carries errno EIO (Errno() uint32), like a failing disk.
var ErrInjected error = &injectedError{}

type injectedError struct{}

func (*injectedError) Error() string { return "faulty: injected fault" }
func (*injectedError) Errno() uint32 { return uint32(unix.EIO) }

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

// Member wraps a member and fails the operations its faults select with ErrInjected; it can
// also delay reads and writes and count what reaches the member underneath. Where several
// faults fire, the first injected decides (a failing one before a dropping one fails the
// write). It has none of the optional capabilities of what it wraps (member.Vectored, ...):
// every operation goes through it. Its Name is the wrapped member's. It is safe for
// concurrent use.
type Member struct {
	member.Member
	mu     sync.Mutex // guards faults, seen, delay, hook
	faults []Fault
	seen   []int // per fault: selected operations so far
	delay  time.Duration
	hook   func(op Op, off int64)
	done   [4]atomic.Int64 // per Op: operations passed to the member

	// Set once by a spec (openSpec) before use: gate, if set, is asked once per operation a
	// fault would fail and may let it pass (the keys after and ctl); delayGate, if set, says
	// whether reads and writes are delayed now (ctl).
	gate, delayGate func() bool
}

// New wraps m, with no faults yet.
func New(m member.Member) *Member { return &Member{Member: m} }

// Unwrap returns the wrapped member (member.Wrapper).
func (f *Member) Unwrap() member.Member { return f.Member }

// SetDelay adds latency d to every read and write (0: none).
func (f *Member) SetDelay(d time.Duration) {
	f.mu.Lock()
	f.delay = d
	f.mu.Unlock()
}

// Count returns how many operations of kind op reached the wrapped member (dropped writes and
// failed operations not counted).
func (f *Member) Count(op Op) int { return int(f.done[op].Load()) }

// SetHook makes fn run before every operation, faulty or not, with the member's lock not
// held (nil: none): tests use it to look at the other members at the moment of an operation.
func (f *Member) SetHook(fn func(op Op, off int64)) {
	f.mu.Lock()
	f.hook = fn
	f.mu.Unlock()
}

// Inject adds a fault.
func (f *Member) Inject(ft Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, ft)
	f.seen = append(f.seen, 0)
}

// Clear removes every fault.
func (f *Member) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults, f.seen = nil, nil
}

// errDropped marks a dropped write inside check.
var errDropped = errors.New("dropped")

func (f *Member) check(op Op, off, n int64) error {
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
	f.mu.Unlock()
	if err != nil && f.gate != nil && !f.gate() { // outside mu: it may stat a file
		err = nil
	}
	if err == nil {
		f.done[op].Add(1)
	}
	if hook != nil {
		hook(op, off)
	}
	if delay > 0 && (op == OpRead || op == OpWrite) && (f.delayGate == nil || f.delayGate()) {
		time.Sleep(delay)
	}
	return err
}

func (f *Member) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(OpRead, off, int64(len(p))); err != nil {
		return 0, err
	}
	return f.Member.ReadAt(p, off)
}

func (f *Member) WriteAt(p []byte, off int64) (int, error) {
	switch err := f.check(OpWrite, off, int64(len(p))); err {
	case nil:
	case errDropped:
		return len(p), nil
	default:
		return 0, err
	}
	return f.Member.WriteAt(p, off)
}

func (f *Member) Sync() error {
	if err := f.check(OpSync, 0, 0); err != nil {
		return err
	}
	return f.Member.Sync()
}

func (f *Member) Trim(off, length int64) error {
	if err := f.check(OpTrim, off, length); err != nil {
		return err
	}
	return f.Member.Trim(off, length)
}
