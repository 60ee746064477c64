package nbdtest

import (
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Violations of the stable-pages contract that a PinnedDevice detects (see PinnedDevice.Err).
var (
	// ErrHeldBufferReused: a buffer the device holds was passed to another call.
	ErrHeldBufferReused = errors.New("nbdtest: a held buffer was passed to another call")
	// ErrHeldBufferChanged: a held buffer's bytes changed before the device released it.
	ErrHeldBufferChanged = errors.New("nbdtest: a held buffer changed before its release")
)

// PinnedDevice is a MemDevice that implements nbd.PinnedWriter the way a write-back cache
// would: WritePinned writes p to memory at once (so reads see it; Fail hooks apply as for
// WriteAt) and then keeps p, even when the write failed, until the test releases it with
// Release or ReleaseAll, from any goroutine, in any order.
//
// It checks the server's side of the contract: a buffer it holds is never passed to another
// ReadAt, WriteAt or WritePinned (tracked by address), and its bytes are the same at release
// as at WritePinned (a CRC). Violations are collected; Err returns them.
type PinnedDevice struct {
	*MemDevice
	// Hold, if set before use, decides per WritePinned whether the device keeps p (true) or
	// releases it before returning (false). Nil keeps every buffer.
	Hold func(off, n int64) bool

	mu   sync.Mutex // guards held and errs
	held []Held
	errs []error

	pins, releases atomic.Int64
}

// Held is a buffer a PinnedDevice holds: P as WritePinned received it, at device offset Off.
type Held struct {
	P       []byte
	Off     int64
	sum     uint32
	release func()
}

// NewPinnedDevice returns a zeroed PinnedDevice of size bytes.
func NewPinnedDevice(size int) *PinnedDevice {
	return &PinnedDevice{MemDevice: NewMemDevice(size)}
}

// WritePinned writes p at off like WriteAt, then keeps p until a Release (or releases it now,
// if Hold says so).
func (d *PinnedDevice) WritePinned(p []byte, off int64, release func()) (int, error) {
	d.pins.Add(1)
	d.checkNotHeld("WritePinned", p)
	n, err := d.write(p, off)
	if d.Hold != nil && !d.Hold(off, int64(len(p))) {
		d.releases.Add(1)
		release()
		return n, err
	}
	d.mu.Lock()
	d.held = append(d.held, Held{P: p, Off: off, sum: crc32.ChecksumIEEE(p), release: release})
	d.mu.Unlock()
	return n, err
}

// ReadAt is MemDevice.ReadAt, checking that p is not a held buffer.
func (d *PinnedDevice) ReadAt(p []byte, off int64) (int, error) {
	d.checkNotHeld("ReadAt", p)
	return d.MemDevice.ReadAt(p, off)
}

// WriteAt is MemDevice.WriteAt, checking that p is not a held buffer.
func (d *PinnedDevice) WriteAt(p []byte, off int64) (int, error) {
	d.checkNotHeld("WriteAt", p)
	return d.MemDevice.WriteAt(p, off)
}

// checkNotHeld records ErrHeldBufferReused if p overlaps a buffer the device holds.
func (d *PinnedDevice) checkNotHeld(op string, p []byte) {
	if len(p) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	end := start + uintptr(len(p))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.held {
		hs := uintptr(unsafe.Pointer(unsafe.SliceData(h.P)))
		if start < hs+uintptr(len(h.P)) && hs < end {
			d.errs = append(d.errs, fmt.Errorf("%w: %s got %#x+%d, held since WritePinned at offset %d",
				ErrHeldBufferReused, op, start, len(p), h.Off))
		}
	}
}

// Release releases one held buffer, chosen by pick among the n held (pick(n) in [0, n); nil
// picks the oldest), after checking its bytes. It reports whether there was one to release.
func (d *PinnedDevice) Release(pick func(n int) int) bool {
	d.mu.Lock()
	if len(d.held) == 0 {
		d.mu.Unlock()
		return false
	}
	i := 0
	if pick != nil {
		i = pick(len(d.held))
	}
	h := d.held[i]
	d.held = append(d.held[:i], d.held[i+1:]...)
	if crc32.ChecksumIEEE(h.P) != h.sum {
		d.errs = append(d.errs, fmt.Errorf("%w: written at offset %d", ErrHeldBufferChanged, h.Off))
	}
	d.mu.Unlock()
	d.releases.Add(1)
	h.release()
	return true
}

// ReleaseAll releases every held buffer, oldest first, and returns how many it released.
func (d *PinnedDevice) ReleaseAll() int {
	n := 0
	for d.Release(nil) {
		n++
	}
	return n
}

// Held returns the buffers held now. The slices alias the server's buffers: a test may read
// them, and may write them only to prove that the server protects them.
func (d *PinnedDevice) Held() []Held {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Held(nil), d.held...)
}

// Pins and Releases count WritePinned calls and the release calls the device has made.
func (d *PinnedDevice) Pins() int64     { return d.pins.Load() }
func (d *PinnedDevice) Releases() int64 { return d.releases.Load() }

// Err returns every contract violation seen so far, joined, or nil.
func (d *PinnedDevice) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return errors.Join(d.errs...)
}
