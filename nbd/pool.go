package nbd

import (
	"fmt"
	"math/bits"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Request buffers are anonymous private mappings (mmap), never garbage-collected memory: the
// server may mprotect and mlock them, hand them to a PinnedWriter past the request's reply, and
// no Go pointer rule is at stake. They come in size classes of powers of two, 4 KiB to 32 MiB;
// a larger request gets a mapping of its own, unmapped when it is done.
//
// Each connection has its own pool (conn.free, under conn.mu): a buffer belongs to one
// connection for its whole life, is charged to that connection's in-flight bytes while it is
// out of the pool, and is unmapped when the connection ends. A connection ends only after every
// buffer it lent to a PinnedWriter has been released.
const (
	pageSize    = 4096
	minBufShift = 12
	maxBufShift = 25
	numClasses  = maxBufShift - minBufShift + 1
)

// buffer is one request buffer. Ownership is a reference count: the request holds one reference
// from acquire until its reply is written, a PinnedWriter one more from WritePinned until it
// calls release. The last one to drop its reference returns the buffer to the pool, so the pool
// never sees a buffer the device still reads.
type buffer struct {
	mem    []byte // the whole mapping: page-aligned, len = cap = its class size (or larger)
	class  int    // size class index, or -1 for a mapping of its own
	c      *conn  // the connection whose pool it belongs to
	locked bool   // mem is mlocked

	refs atomic.Int32 // references held: the request's and the device's
	held atomic.Bool  // a PinnedWriter holds the buffer (WritePinned called, release not yet)

	// charge is the number of bytes counted in c.inflightBytes for this buffer, shared the
	// part of them charged to the server-wide budget so far (a WRITE's payload is charged as
	// it arrives: see readPayload), and protected whether mem is read-only (DebugImmutable).
	// They are set by the request's owner before the buffer is pinned and read by whoever
	// drops the last reference.
	charge    int64
	shared    int64
	protected bool

	release func() // b.devRelease, bound once when the buffer is mapped
}

// classOf returns the size class for n bytes (n > 0), or -1 when n is above the largest class.
func classOf(n int) int {
	if n > 1<<maxBufShift {
		return -1
	}
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

// mapBuffer maps a new buffer for class (or for n bytes rounded up to pages, when class is -1)
// and, when lock is set, mlocks it. A failed mlock comes back as lockErr but is no error: the
// buffer is usable, only not locked (b.locked says which).
func mapBuffer(c *conn, class, n int, lock bool) (b *buffer, lockErr error, err error) {
	size := (n + pageSize - 1) &^ (pageSize - 1)
	if class >= 0 {
		size = 1 << (class + minBufShift)
	}
	mem, err := mmapFunc(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("nbd: mapping a %d-byte request buffer: %w", size, err)
	}
	b = &buffer{mem: mem, class: class, c: c}
	if lock {
		lockErr = unix.Mlock(mem)
		b.locked = lockErr == nil
	}
	b.release = b.devRelease
	return b, lockErr, nil
}

// mmapFunc is unix.Mmap; tests replace it to make mapping fail.
var mmapFunc = unix.Mmap

// unmap releases b's memory (and its lock). b must be unreferenced and is unusable after.
func (b *buffer) unmap() {
	if err := unix.Munmap(b.mem); err != nil {
		// Only a wrong slice can make munmap fail: a bug here, not a runtime condition.
		panic(fmt.Sprintf("nbd: munmap of a request buffer: %v", err))
	}
	b.mem = nil
}

// protect makes b read-only while a device holds it; unprotect makes it writable again.
func (b *buffer) protect() {
	if err := unix.Mprotect(b.mem, unix.PROT_READ); err != nil {
		panic(fmt.Sprintf("nbd: mprotect(PROT_READ) of a request buffer: %v", err))
	}
	b.protected = true
}

func (b *buffer) unprotect() {
	if !b.protected {
		return
	}
	if err := unix.Mprotect(b.mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		panic(fmt.Sprintf("nbd: mprotect(PROT_READ|PROT_WRITE) of a request buffer: %v", err))
	}
	b.protected = false
}

// pin takes the device's reference before WritePinned.
func (b *buffer) pin(debugImmutable bool) {
	b.refs.Add(1)
	b.held.Store(true)
	if debugImmutable {
		b.protect()
	}
	st := &b.c.srv.bufStats
	st.pinnedWrites.Add(1)
	st.pinned.Add(1)
	st.pinnedBytes.Add(b.charge)
}

// devRelease is the release func handed to WritePinned: it drops the device's reference. A
// second call for the same WritePinned breaks the PinnedWriter contract and panics, since the
// buffer may already serve another request.
func (b *buffer) devRelease() {
	if !b.held.CompareAndSwap(true, false) {
		panic("nbd: PinnedWriter release called twice for one WritePinned")
	}
	st := &b.c.srv.bufStats
	st.pinned.Add(-1)
	st.pinnedBytes.Add(-b.charge)
	if b.refs.Add(-1) == 0 {
		b.c.finish(nil, b)
	}
}

// BufferStats describes a server's request buffers at one moment (see Server.BufferStats).
type BufferStats struct {
	// Mapped and Locked are the bytes of request buffers mapped now and, of those, mlocked.
	Mapped, Locked int64
	// Out is the number of buffers out of their pools: serving a request or held by a device.
	Out int64
	// Pinned and PinnedBytes are the buffers a PinnedWriter holds now and their request bytes.
	Pinned, PinnedBytes int64
	// PinnedWrites counts WritePinned calls so far.
	PinnedWrites int64
}

// bufStats are the server-wide counters behind BufferStats.
type bufStats struct {
	mapped, locked, out, pinned, pinnedBytes, pinnedWrites atomic.Int64
}

// BufferStats returns the server's buffer counters. Once every connection has ended, Mapped,
// Locked, Out and Pinned are zero.
func (s *Server) BufferStats() BufferStats {
	st := &s.bufStats
	return BufferStats{
		Mapped: st.mapped.Load(), Locked: st.locked.Load(), Out: st.out.Load(),
		Pinned: st.pinned.Load(), PinnedBytes: st.pinnedBytes.Load(),
		PinnedWrites: st.pinnedWrites.Load(),
	}
}
