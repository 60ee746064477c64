// Package nbdtest offers in-memory devices for testing code that serves or drives an nbd.Device,
// and Serve and ServeUnix to run a server for a test's lifetime, as httptest does for HTTP.
package nbdtest

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// ErrOutOfRange is returned by MemDevice methods for a range beyond the device.
var ErrOutOfRange = errors.New("nbdtest: range beyond end of device")

// Op names a MemDevice method for Fail hooks.
type Op string

// The operations a Fail hook sees.
const (
	OpRead        Op = "read"
	OpWrite       Op = "write"
	OpFlush       Op = "flush"
	OpTrim        Op = "trim"
	OpWriteZeroes Op = "write-zeroes"
)

// MemDevice is an nbd.Device held in memory. It is safe for concurrent use; overlapping calls
// are serialised by an RWMutex, as a disk would order them. Trim zeroes the range.
type MemDevice struct {
	// Fail, if set before the device is used, is called at the start of every method; a
	// non-nil error is returned without touching the data.
	Fail func(op Op, off, n int64) error
	// Delay, if set before the device is used, is called at the start of every read and
	// write after Fail (tests use it to hold requests in flight or reorder them).
	Delay func(op Op, off, n int64)

	mu   sync.RWMutex // guards data
	data []byte

	reads, writes, fuaWrites, flushes, trims, zeroes, noHoles atomic.Int64
	active, maxActive                                         atomic.Int64
}

// NewMemDevice returns a zeroed device of size bytes.
func NewMemDevice(size int) *MemDevice { return &MemDevice{data: make([]byte, size)} }

// Stats counts the calls a MemDevice has served.
type Stats struct {
	Reads, Writes, FUAWrites, Flushes, Trims, WriteZeroes, NoHole int64
	// MaxConcurrent is the most ReadAt/WriteAt calls that were in progress at once.
	MaxConcurrent int64
}

// Stats returns the call counts so far.
func (d *MemDevice) Stats() Stats {
	return Stats{
		Reads: d.reads.Load(), Writes: d.writes.Load(), FUAWrites: d.fuaWrites.Load(),
		Flushes: d.flushes.Load(), Trims: d.trims.Load(), WriteZeroes: d.zeroes.Load(),
		NoHole: d.noHoles.Load(), MaxConcurrent: d.maxActive.Load(),
	}
}

// Bytes returns a copy of the device's contents.
func (d *MemDevice) Bytes() []byte {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return append([]byte(nil), d.data...)
}

// Size returns the device size.
func (d *MemDevice) Size() (int64, error) { return int64(len(d.data)), nil }

func (d *MemDevice) check(op Op, off, n int64) error {
	if d.Fail != nil {
		if err := d.Fail(op, off, n); err != nil {
			return err
		}
	}
	if off < 0 || n < 0 || off > int64(len(d.data)) || n > int64(len(d.data))-off {
		return fmt.Errorf("%w: %s %d bytes at %d", ErrOutOfRange, op, n, off)
	}
	return nil
}

// enter and leave track concurrent ReadAt/WriteAt calls, for Stats.MaxConcurrent.
func (d *MemDevice) enter(op Op, off, n int64) {
	a := d.active.Add(1)
	for m := d.maxActive.Load(); a > m && !d.maxActive.CompareAndSwap(m, a); m = d.maxActive.Load() {
	}
	if d.Delay != nil {
		d.Delay(op, off, n)
	}
}

func (d *MemDevice) leave() { d.active.Add(-1) }

// ReadAt copies from the device into p.
func (d *MemDevice) ReadAt(p []byte, off int64) (int, error) {
	d.reads.Add(1)
	if err := d.check(OpRead, off, int64(len(p))); err != nil {
		if errors.Is(err, ErrOutOfRange) && off >= 0 && off <= int64(len(d.data)) {
			d.mu.RLock()
			n := copy(p, d.data[off:])
			d.mu.RUnlock()
			return n, io.EOF
		}
		return 0, err
	}
	d.enter(OpRead, off, int64(len(p)))
	defer d.leave()
	d.mu.RLock()
	defer d.mu.RUnlock()
	return copy(p, d.data[off:]), nil
}

// WriteAt copies p onto the device. It does not keep p.
func (d *MemDevice) WriteAt(p []byte, off int64) (int, error) {
	d.writes.Add(1)
	return d.write(p, off)
}

func (d *MemDevice) write(p []byte, off int64) (int, error) {
	if err := d.check(OpWrite, off, int64(len(p))); err != nil {
		return 0, err
	}
	d.enter(OpWrite, off, int64(len(p)))
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(d.data[off:], p), nil
}

// Flush counts; memory is as durable as it gets.
func (d *MemDevice) Flush() error {
	d.flushes.Add(1)
	return d.check(OpFlush, 0, 0)
}

// Trim zeroes the range.
func (d *MemDevice) Trim(off, length int64) error {
	d.trims.Add(1)
	return d.zero(OpTrim, off, length)
}

// WriteZeroes zeroes the range and counts noHole requests.
func (d *MemDevice) WriteZeroes(off, length int64, noHole bool) error {
	d.zeroes.Add(1)
	if noHole {
		d.noHoles.Add(1)
	}
	return d.zero(OpWriteZeroes, off, length)
}

func (d *MemDevice) zero(op Op, off, length int64) error {
	if err := d.check(op, off, length); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.data[off : off+length])
	return nil
}

// FUADevice is a MemDevice that also implements nbd.FUAWriter.
type FUADevice struct{ *MemDevice }

// WriteAtFUA writes p like WriteAt and counts it as a FUA write.
func (d FUADevice) WriteAtFUA(p []byte, off int64) (int, error) {
	d.fuaWrites.Add(1)
	return d.write(p, off)
}
