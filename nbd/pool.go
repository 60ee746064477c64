package nbd

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
	"github.com/raid5d/raid5d/nbd/internal/wire"
	"golang.org/x/sys/unix"
)

// Request buffers are anonymous private mappings (mmap), never garbage-collected memory: the
// server may mprotect and mlock them, hand them to a PinnedWriter past the request's reply, and
// no Go pointer rule is at stake. They come in size classes of powers of two, 4 KiB to 32 MiB;
// a larger request gets a mapping of its own, unmapped when it is done.
//
// Each connection has its own pool (conn.pool, under conn.mu): a buffer belongs to one
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

// buffers is a connection's in-flight bounds (Options.MaxInFlightRequests, MaxInFlightBytes)
// and its pool of request buffers, with the requests they go with.
type buffers struct {
	// mu guards the in-flight accounting, the free lists of requests and buffers, and the
	// worker count; cond (on mu) wakes the reader when a request or a buffer is released.
	mu            sync.Mutex
	cond          sync.Cond
	inflight      int                   // requests acquired and not yet released
	inflightBytes int64                 // request bytes of the buffers out of the pool
	free          []*request            // released requests, for reuse
	nworkers      int                   // workers started; never fewer than inflight
	pool          [numClasses][]*buffer // free buffers by size class
	poolBytes     int64                 // their mapped bytes
	bufsOut       int                   // buffers out of the pool: with a request or a device
}

// acquire waits until the connection's in-flight limits admit a request like h, then returns
// a request for it, with a buffer for READ and WRITE. It starts a worker if none is idle. Only
// READ and WRITE wait for bytes: a FLUSH goes through even while the device holds pinned
// buffers up to the limit. It fails only when a new buffer cannot be mapped.
func (c *conn) acquire(h *protocol.TransmissionRequestHeader) (*request, error) {
	n := int64(0)
	if h.Type == wire.CmdRead || h.Type == wire.CmdWrite {
		n = int64(h.Length)
	}
	class := classOf(int(n))
	c.mu.Lock()
	for c.inflight >= c.srv.maxInFlightReqs ||
		(n > 0 && c.inflightBytes > 0 && c.inflightBytes+n > c.srv.maxInFlightBytes) {
		c.cond.Wait()
	}
	c.inflight++
	var req *request
	if k := len(c.free); k > 0 {
		req = c.free[k-1]
		c.free = c.free[:k-1]
	} else {
		req = new(request)
	}
	var b *buffer
	if n > 0 {
		c.inflightBytes += n
		c.bufsOut++
		if class >= 0 && len(c.pool[class]) > 0 {
			k := len(c.pool[class]) - 1
			b = c.pool[class][k]
			c.pool[class] = c.pool[class][:k]
			c.poolBytes -= int64(len(b.mem))
		}
	}
	if c.nworkers < c.inflight {
		c.nworkers++
		c.workers.Go(c.worker)
	}
	c.mu.Unlock()
	shared := n // what the server-wide budget is charged now: a long WRITE, its first piece
	if h.Type == wire.CmdWrite {
		shared = min(n, payloadPiece)
	}
	if n > 0 && c.srv.mem.take(c.hold, shared, false) {
		c.srv.memLog.warn(c.log, "nbd: server-wide in-flight bytes reached MaxTotalInFlightBytes; "+
			"a request waited for other connections' requests to finish",
			"limit", "MaxTotalInFlightBytes", "max", c.srv.mem.max, "length", n)
	}

	req.typ, req.flags, req.cookie = h.Type, h.CommandFlags, h.Handle
	req.off, req.length = h.Offset, h.Length
	req.pinned = false
	if n > 0 {
		if b == nil {
			var err error
			if b, err = c.newBuffer(class, int(n)); err != nil {
				c.mu.Lock()
				c.inflightBytes -= n
				c.bufsOut--
				c.mu.Unlock()
				c.srv.mem.give(c.hold, shared)
				c.finish(req, nil)
				return nil, err
			}
		}
		c.srv.bufStats.out.Add(1)
		b.refs.Store(1)
		b.charge, b.shared = n, shared
		req.buf = b
	}
	return req, nil
}

// newBuffer maps a buffer for class (n bytes if class is -1), mlocked if the server says so.
func (c *conn) newBuffer(class, n int) (*buffer, error) {
	b, lockErr, err := mapBuffer(c, class, n, c.srv.mlock)
	if err != nil {
		return nil, err
	}
	st := &c.srv.bufStats
	st.mapped.Add(int64(len(b.mem)))
	if b.locked {
		st.locked.Add(int64(len(b.mem)))
	}
	if lockErr != nil && c.srv.mlockWarned.CompareAndSwap(false, true) {
		c.log.Warn("nbd: mlock of a request buffer failed; serving with unlocked buffers",
			"err", lockErr, "mapped", st.mapped.Load(), "locked", st.locked.Load())
	}
	return b, nil
}

// unmapBuffer unmaps a buffer that has left the pool for good.
func (c *conn) unmapBuffer(b *buffer) {
	st := &c.srv.bufStats
	st.mapped.Add(-int64(len(b.mem)))
	if b.locked {
		st.locked.Add(-int64(len(b.mem)))
	}
	b.unmap()
}

// release ends req: its reply has been written (or abandoned). It drops the request's reference
// to its buffer; the buffer goes back to the pool now, or when the device that still holds it
// calls release.
func (c *conn) release(req *request) {
	b := req.buf
	req.buf = nil
	req.payload = nil
	if req.mapped {
		req.mapped = false
		clear(req.vec)
		req.vec = req.vec[:0]
		c.mapped.ReleaseMapped()
	}
	if b != nil && b.refs.Add(-1) != 0 {
		b = nil // a PinnedWriter still holds it; its release call finishes it
	}
	c.finish(req, b)
}

// finish puts req (if not nil) on the free list and returns b (if not nil), whose last
// reference has been dropped, to the pool, uncharging its bytes. b is made writable again
// first; a buffer the pool cannot keep is unmapped.
func (c *conn) finish(req *request, b *buffer) {
	if b != nil {
		b.unprotect()
		c.srv.bufStats.out.Add(-1)
	}
	if b != nil {
		c.srv.mem.give(c.hold, b.shared)
	}
	var drop *buffer
	c.mu.Lock()
	if req != nil {
		c.inflight--
		c.free = append(c.free, req)
		if c.inflight == 0 && c.srv.idleTimeout > 0 {
			c.lastActive.Store(time.Now().UnixNano())
		}
	}
	if b != nil {
		c.inflightBytes -= b.charge
		c.bufsOut--
		size := int64(len(b.mem))
		if b.class >= 0 && c.poolBytes+size <= c.srv.poolLimit {
			c.pool[b.class] = append(c.pool[b.class], b)
			c.poolBytes += size
		} else {
			drop = b
		}
	}
	c.mu.Unlock()
	c.cond.Signal()
	if drop != nil {
		c.unmapBuffer(drop)
	}
}

// waitBuffers waits, once the workers are done, until the device has released every buffer it
// holds, then unmaps the pool. A device that keeps buffers past Options.ShutdownTimeout gets a
// log line, and is waited for all the same: unmapping a buffer it still reads would crash.
func (c *conn) waitBuffers() {
	c.mu.Lock()
	if c.bufsOut > 0 {
		warn := time.AfterFunc(c.srv.shutdownTimeout, func() {
			c.mu.Lock()
			n := c.bufsOut
			c.mu.Unlock()
			c.log.Warn("nbd: connection done but the device still holds pinned buffers; waiting",
				"buffers", n)
		})
		for c.bufsOut > 0 {
			c.cond.Wait()
		}
		warn.Stop()
	}
	var all []*buffer
	for i := range c.pool {
		all = append(all, c.pool[i]...)
		c.pool[i] = nil
	}
	c.poolBytes = 0
	c.mu.Unlock()
	for _, b := range all {
		c.unmapBuffer(b)
	}
}
