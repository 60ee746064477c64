package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// conn is one client connection. Its reader (the goroutine running ServeConn) decodes requests
// and hands them to workers; workers call the Device and write the replies.
type conn struct {
	srv *Server
	nc  net.Conn      // the connection, or the TLS session on it after STARTTLS
	raw net.Conn      // the connection itself, for deadlines (they apply under TLS as well)
	br  *bufio.Reader // owned by the reader goroutine
	log *slog.Logger

	sess   *session
	fua    FUAWriter    // the export's Device as a FUAWriter, or nil
	pinned PinnedWriter // the export's Device as a PinnedWriter if StablePages is on, or nil
	mapped MappedReader // the export's Device as a MappedReader if MappedReads is on, or nil

	// writeMu serialises writes on nc, so that a header and its payload go out together.
	// It guards writeErr and errHdr.
	writeMu  sync.Mutex
	writeErr error                // first failed reply write; later replies are dropped
	errHdr   [maxReplyHeader]byte // header of error replies sent by the reader itself

	// shutdownAt is the write deadline shutdown set (UnixNano), or 0: reply writes take the
	// earlier of it and their own ReplyTimeout, so shutdown still bounds them.
	shutdownAt atomic.Int64

	// Replies are coalesced: a worker with a reply queues its request on replyQ and, if no
	// worker is writing, becomes the writer: it writes every queued reply with one writev,
	// releases those requests, and repeats until replyQ is empty. A lone reply goes out at
	// once; replies completed while a write is under way go out together in the next one.
	// qmu guards replyQ, spareQ and writing; wbufs and iovs belong to the writer.
	qmu     sync.Mutex
	replyQ  []*request  // requests whose replies are ready, in completion order
	spareQ  []*request  // the last written batch's slice, reused as the next replyQ
	writing bool        // a worker is writing replyQ
	iovs    [][]byte    // backing array of wbufs, kept across batches
	wbufs   net.Buffers // the batch being written (a field, so WriteTo does not allocate)
	// serving counts the requests handed to the workers whose replies are not queued yet: a
	// writer with a single reply lets them run first when there are some (see reply).
	serving atomic.Int32

	// mu guards the in-flight accounting, the free lists of requests and buffers, and the
	// worker count; cond (on mu) wakes the reader when a request or a buffer is released.
	mu            sync.Mutex
	cond          sync.Cond
	inflight      int                   // requests acquired and not yet released
	inflightBytes int64                 // request bytes of the buffers out of the pool
	free          []*request            // released requests, for reuse
	nworkers      int                   // workers started; never fewer than inflight
	pool          [numClasses][]*buffer // free buffers by size class (see pool.go)
	poolBytes     int64                 // their mapped bytes
	bufsOut       int                   // buffers out of the pool: with a request or a device

	work    chan *request // reader → workers; closed when the reader stops
	workers sync.WaitGroup

	// hold is the connection's part of the server-wide budget (Server.mem).
	hold *holder
	// stopped is set before the read deadline is moved into the past to stop the reader (idle
	// timeout, a failed reply write, shutdown), so that the reader, which sets deadlines of its
	// own for payloads, does not lift it again (see setReadDeadline).
	stopped atomic.Bool

	// Idle timeout (Options.IdleTimeout > 0): lastActive is the time (UnixNano) of the last
	// request read or of the last request finishing; idleTimer checks it. idleTimer and
	// idleDone are guarded by mu; idled is set when the timer stopped the reader.
	lastActive atomic.Int64
	idleTimer  *time.Timer
	idleDone   bool
	idled      atomic.Bool
}

// request is one request in flight. It belongs to the reader until sent on work, then to one
// worker until release; its buffer is never shared with another request, and outlives it only
// while a PinnedWriter holds it.
type request struct {
	typ, flags uint16
	cookie     uint64
	off        uint64
	length     uint32
	buf        *buffer // pooled buffer for READ and WRITE, nil otherwise

	hdr     [maxReplyHeader]byte // the reply's header (simple, or a chunk header and its fixed part)
	hdrLen  int                  // bytes of hdr in use
	payload []byte               // the reply's payload (part of buf, or bsWire), or nil
	// A READ answered by a MappedReader: vec holds the payload's pieces (payload still has
	// its length), and mapped says ReleaseMapped is owed. vec's backing array is kept.
	vec    [][]byte
	mapped bool

	// BLOCK_STATUS only, allocated at the first one and kept with the request for reuse (at
	// most maxBlockStatusExtents each): the device's extents and their wire form.
	extents []Extent
	bsWire  []byte
}

// maxReplyHeader bounds what goes before a reply's payload: a structured error chunk with its
// message (at most maxErrorMessage bytes) and offset is the longest.
const (
	maxErrorMessage = 64
	maxReplyHeader  = chunkHeaderSize + 4 + 2 + maxErrorMessage + 8
)

func newConn(s *Server, nc net.Conn, log *slog.Logger) *conn {
	c := &conn{srv: s, nc: nc, raw: nc, br: bufio.NewReaderSize(nc, 64<<10), log: log, hold: newHolder()}
	c.cond.L = &c.mu
	return c
}

// transmit runs the transmission phase until DISC, a broken stream or shutdown, then waits for
// every request in flight to be processed and replied to. The caller closes the connection.
func (c *conn) transmit(ctx context.Context, sess *session) {
	c.sess = sess
	c.fua, _ = sess.export.Device.(FUAWriter)
	if sess.export.StablePages {
		c.pinned, _ = sess.export.Device.(PinnedWriter)
	}
	if sess.export.MappedReads && c.nc == c.raw { // not under TLS: see Export.MappedReads
		c.mapped, _ = sess.export.Device.(MappedReader)
	}
	c.work = make(chan *request, c.srv.maxInFlightReqs)
	if c.srv.idleTimeout > 0 {
		c.lastActive.Store(time.Now().UnixNano())
		c.mu.Lock()
		c.idleTimer = time.AfterFunc(c.srv.idleTimeout, c.checkIdle)
		c.mu.Unlock()
	}

	c.srv.mem.join()
	defer c.srv.mem.leave() // after waitBuffers: the connection holds nothing by then
	err := c.readRequests()
	if c.srv.idleTimeout > 0 {
		c.mu.Lock()
		c.idleTimer.Stop()
		c.idleDone = true
		c.mu.Unlock()
	}

	close(c.work)
	c.workers.Wait()
	c.waitBuffers()

	c.writeMu.Lock()
	werr := c.writeErr
	c.writeMu.Unlock()
	var pe *payloadTimeoutError
	switch {
	case errors.As(err, &pe) && werr == nil:
		c.log.Warn("nbd: closing connection: a WRITE payload did not arrive in time", "limit", "PayloadTimeout",
			"offset", pe.offset, "received", pe.received, "expected", pe.expected, "err", err)
	case c.idled.Load() && werr == nil:
		c.log.Warn("nbd: closing idle connection", "limit", "IdleTimeout", "err",
			fmt.Errorf("%w: no request for %v (IdleTimeout)", ErrIdleTimeout, c.srv.idleTimeout))
	case err == nil && werr == nil:
		c.log.Info("nbd: client disconnected (NBD_CMD_DISC)")
	case werr != nil && ctx.Err() != nil:
		c.log.Warn("nbd: server shutting down: gave up writing replies", "err", werr)
	case werr != nil && isTimeout(werr):
		c.log.Warn("nbd: closing connection: the client stopped reading its replies",
			"limit", "ReplyTimeout", "err", fmt.Errorf("%w: a reply write took over %v (ReplyTimeout): %w",
				ErrReplyTimeout, c.srv.replyTimeout, werr))
	case werr != nil && isClosed(werr):
		c.log.Info("nbd: client went away before its replies were written", "err", werr)
	case werr != nil && errors.Is(werr, syscall.EFAULT):
		// Only a MappedReader's memory can fault under the kernel: a page it reported
		// readable could not be read back (evicted, then a read error).
		c.log.Error("nbd: closing connection: a mapped read's bytes could not be read while its reply "+
			"was written (a read error behind the device?)", "err", werr)
	case werr != nil:
		c.log.Warn("nbd: closing connection: writing a reply failed", "err", werr)
	case ctx.Err() != nil:
		c.log.Info("nbd: closing connection: server shutting down")
	case isClosed(err):
		c.log.Info("nbd: client closed the connection", "err", err)
	default:
		c.log.Warn("nbd: closing connection", "err", err)
	}
}

// readRequests reads and dispatches requests. It returns nil on NBD_CMD_DISC, else why it
// stopped: a read error, ErrBadRequestMagic or ErrPayloadTooLarge.
func (c *conn) readRequests() error {
	var hb [requestHeaderSize]byte
	direct := false // the last request was a large WRITE: see readPayload
	for {
		var err error
		if direct && c.br.Buffered() == 0 {
			_, err = io.ReadFull(c.nc, hb[:])
		} else {
			_, err = io.ReadFull(c.br, hb[:])
		}
		if err != nil {
			return err
		}
		if c.srv.idleTimeout > 0 {
			c.lastActive.Store(time.Now().UnixNano())
		}
		h := decodeRequest(&hb)
		errno, err := checkRequest(&h, c.sess)
		if err != nil {
			return err
		}
		if h.Type == cmdDisc {
			return nil
		}
		if errno != 0 {
			if h.Type == cmdWrite {
				// Stay in sync: the payload follows whatever we think of the request.
				if err := c.discardPayload(&h); err != nil {
					return err
				}
			}
			c.log.Debug("nbd: request refused", "cmd", cmdName(h.Type), "flags", h.CommandFlags,
				"offset", h.Offset, "length", h.Length, "errno", errno)
			c.replyFromReader(&h, errno)
			continue
		}
		req, err := c.acquire(&h)
		if err != nil {
			// No memory for the buffer: refuse this request, keep the stream in sync.
			if h.Type == cmdWrite {
				if err := c.discardPayload(&h); err != nil {
					return err
				}
			}
			c.log.Warn("nbd: request refused", "cmd", cmdName(h.Type), "offset", h.Offset,
				"length", h.Length, "errno", errnoIO, "err", err)
			c.replyFromReader(&h, errnoIO)
			continue
		}
		direct = false
		if h.Type == cmdWrite && h.Length > 0 {
			err := c.readPayload(req)
			c.srv.mem.endPayload(c.hold)
			if err != nil {
				c.release(req)
				return err
			}
			direct = h.Length >= directReadMin
		}
		c.serving.Add(1)
		c.work <- req // never blocks: acquire keeps inflight <= cap(c.work)
	}
}

// directReadMin is the shortest WRITE payload, or rest of one, read straight from the
// connection into the request buffer rather than through the connection's buffered reader.
// The buffered reader batches small requests (one read brings in many), but a payload that
// passes through it is copied twice; after a large WRITE the next header is read on its own,
// so that the buffered reader does not fetch the next payload ahead into its buffer either.
// For 48 KiB writes the copy through the buffer was 9% of the daemon's CPU.
const directReadMin = 16 << 10

// payloadPiece is how much of a WRITE's payload is charged to the server-wide budget ahead of
// its arrival: acquire charges a WRITE up to this long in full, a longer one this much, and
// readPayload charges each further piece before reading it. So a client that sends a header
// and then stalls holds at most one piece that it has not sent.
const payloadPiece = 1 << 20

// readPayload reads req's WRITE payload into its buffer: what the buffered reader already
// holds, then the rest straight from the connection if it is long (directReadMin), else
// through the reader. The payload must arrive within PayloadTimeout of the first read that
// waits for it, not counting the time spent waiting for the budget; past it the read fails
// with a *payloadTimeoutError. The caller calls endPayload afterwards.
func (c *conn) readPayload(req *request) error {
	b := req.buf
	p := b.mem[:req.length]
	n := 0
	var deadline time.Time // zero until the first read from the socket sets it
	defer func() {
		if !deadline.IsZero() {
			c.setReadDeadline(time.Time{})
		}
	}()
	for n < len(p) {
		if int64(n) == b.shared {
			k := int64(min(payloadPiece, len(p)-n))
			t0 := time.Now()
			if c.srv.mem.take(c.hold, k, true) && !deadline.IsZero() {
				deadline = deadline.Add(time.Since(t0)) // the client was not keeping us waiting
				c.setReadDeadline(deadline)
			}
			b.shared += k
		}
		end := int(b.shared)
		if k := c.br.Buffered(); k > 0 {
			m, _ := c.br.Read(p[n:min(n+k, end)]) // a copy from the buffer: cannot fail
			n += m
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(c.srv.payloadTimeout)
			c.setReadDeadline(deadline)
		}
		var m int
		var err error
		if len(p)-n >= directReadMin {
			m, err = io.ReadFull(c.nc, p[n:end])
		} else {
			m, err = io.ReadFull(c.br, p[n:end])
		}
		n += m
		if err != nil {
			return c.payloadError(req.off, n, len(p), err)
		}
	}
	return nil
}

// discardPayload reads and drops the payload of a WRITE the reader refused, within
// PayloadTimeout like readPayload.
func (c *conn) discardPayload(h *protocol.TransmissionRequestHeader) error {
	if int64(c.br.Buffered()) < int64(h.Length) {
		c.setReadDeadline(time.Now().Add(c.srv.payloadTimeout))
		defer c.setReadDeadline(time.Time{})
	}
	n, err := io.CopyN(io.Discard, c.br, int64(h.Length))
	if err != nil {
		return c.payloadError(h.Offset, int(n), int(h.Length), err)
	}
	return nil
}

// payloadError returns err, the reason a payload read stopped after received of expected
// bytes, as a *payloadTimeoutError if its deadline passed.
func (c *conn) payloadError(off uint64, received, expected int, err error) error {
	if !isTimeout(err) || c.stopped.Load() {
		return err // the client went away, or the reader was stopped
	}
	return &payloadTimeoutError{offset: off, received: received, expected: expected,
		timeout: c.srv.payloadTimeout, err: err}
}

// payloadTimeoutError says that a WRITE payload did not arrive within PayloadTimeout. It is
// ErrPayloadTimeout (errors.Is) and wraps the read's own error.
type payloadTimeoutError struct {
	offset             uint64
	received, expected int
	timeout            time.Duration
	err                error
}

func (e *payloadTimeoutError) Error() string {
	return fmt.Sprintf("%v: %d of %d bytes of a WRITE at offset %d within %v (PayloadTimeout): %v",
		ErrPayloadTimeout, e.received, e.expected, e.offset, e.timeout, e.err)
}

func (e *payloadTimeoutError) Unwrap() []error { return []error{ErrPayloadTimeout, e.err} }

// setReadDeadline sets the reader's read deadline, unless the reader has been stopped: then it
// leaves (puts back) the deadline in the past. Called by the reader only.
func (c *conn) setReadDeadline(t time.Time) {
	c.raw.SetReadDeadline(t)
	if c.stopped.Load() { // stopReading's store came first, its deadline maybe not
		c.raw.SetReadDeadline(aLongTimeAgo)
	}
}

// stopReading makes the reader's pending and future reads fail at once.
func (c *conn) stopReading() {
	c.stopped.Store(true)
	c.raw.SetReadDeadline(aLongTimeAgo)
}

// checkRequest validates a request header against the session. It returns an error if the
// stream is broken and the connection must close (ErrBadRequestMagic, ErrPayloadTooLarge);
// otherwise the errno to reply with, or 0 if the request may proceed. DISC is always admitted.
func checkRequest(h *protocol.TransmissionRequestHeader, sess *session) (uint32, error) {
	e := sess.export
	if h.RequestMagic != magicRequest {
		return 0, fmt.Errorf("%w: %#x", ErrBadRequestMagic, h.RequestMagic)
	}
	if h.Type == cmdWrite && h.Length > e.MaxBlock {
		return 0, fmt.Errorf("%w: %d bytes at offset %d (MaxBlock %d)",
			ErrPayloadTooLarge, h.Length, h.Offset, e.MaxBlock)
	}
	return checkCommand(h, sess), nil
}

// checkCommand returns the errno for a request with a good magic and a payload it can read.
func checkCommand(h *protocol.TransmissionRequestHeader, sess *session) uint32 {
	e := sess.export
	allowed := uint16(0)
	if sess.flags&tflagSendFUA != 0 {
		allowed |= cmdFlagFUA // valid on every command once advertised
	}
	write := false
	switch h.Type {
	case cmdRead:
		if sess.structured {
			allowed |= cmdFlagDF // every READ reply is one chunk anyway
		}
	case cmdCache:
	case cmdBlockStatus:
		if !sess.metaAlloc || h.Length == 0 {
			return errnoInval // no context selected; or nothing to describe
		}
		allowed |= cmdFlagReqOne
	case cmdDisc:
		return 0 // flags, offset and length are ignored: the client is leaving
	case cmdWrite, cmdTrim:
		write = true
	case cmdWriteZeroes:
		write = true
		allowed |= cmdFlagNoHole
	case cmdFlush:
		if h.CommandFlags&^allowed != 0 {
			return errnoInval
		}
		return 0 // offset and length are reserved; ignored
	default:
		return errnoInval // unknown command
	}
	if h.CommandFlags&^allowed != 0 {
		return errnoInval
	}
	if write && e.ReadOnly {
		return errnoPerm
	}
	if h.Offset > sess.size || uint64(h.Length) > sess.size-h.Offset {
		if h.Type == cmdWrite || h.Type == cmdWriteZeroes {
			return errnoNoSpace
		}
		return errnoInval
	}
	// The length of a BLOCK_STATUS is a hint (clients ask for "the rest", rounded to
	// nothing in particular), so only its offset must be aligned.
	mb := uint64(e.MinBlock)
	if h.Offset%mb != 0 || (uint64(h.Length)%mb != 0 && h.Offset+uint64(h.Length) != sess.size &&
		h.Type != cmdBlockStatus) {
		return errnoInval
	}
	if h.Type == cmdRead && h.Length > e.MaxBlock {
		// A simple reply cannot carry more than the maximum payload: the request fails.
		return errnoInval
	}
	return 0
}

// acquire waits until the connection's in-flight limits admit a request like h, then returns
// a request for it, with a buffer for READ and WRITE. It starts a worker if none is idle. Only
// READ and WRITE wait for bytes: a FLUSH goes through even while the device holds pinned
// buffers up to the limit. It fails only when a new buffer cannot be mapped.
func (c *conn) acquire(h *protocol.TransmissionRequestHeader) (*request, error) {
	n := int64(0)
	if h.Type == cmdRead || h.Type == cmdWrite {
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
	if h.Type == cmdWrite {
		shared = min(n, payloadPiece)
	}
	if n > 0 && c.srv.mem.take(c.hold, shared, false) {
		c.srv.memLog.warn(c.log, "nbd: server-wide in-flight bytes reached MaxTotalInFlightBytes; "+
			"a request waited for other connections' requests to finish",
			"limit", "MaxTotalInFlightBytes", "max", c.srv.mem.max, "length", n)
	}

	req.typ, req.flags, req.cookie = h.Type, h.CommandFlags, h.Handle
	req.off, req.length = h.Offset, h.Length
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

// checkIdle runs on idleTimer: it stops the reader if the connection has been idle for
// IdleTimeout, else sets the timer for when it could be.
func (c *conn) checkIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idleDone {
		return
	}
	idle := time.Since(time.Unix(0, c.lastActive.Load()))
	switch {
	case c.inflight > 0:
		c.idleTimer.Reset(c.srv.idleTimeout)
	case idle < c.srv.idleTimeout:
		c.idleTimer.Reset(c.srv.idleTimeout - idle)
	default:
		c.idled.Store(true)
		c.stopReading()
	}
}

// worker processes requests until the reader closes work. Each request is released once its
// reply is written, by whichever worker writes it (see reply).
func (c *conn) worker() {
	for req := range c.work {
		c.serveRequest(req)
	}
}

// serveRequest performs one validated request on the Device and hands its reply to reply,
// which owns req from then on.
func (c *conn) serveRequest(req *request) {
	dev := c.sess.export.Device
	off := int64(req.off)
	fua := req.flags&cmdFlagFUA != 0
	errOff := int64(-1) // where a failed READ failed, for NBD_REPLY_TYPE_ERROR_OFFSET
	var err error
	switch req.typ {
	case cmdRead:
		if req.length == 0 {
			break
		}
		p := req.buf.mem[:req.length]
		if c.mapped != nil {
			if v, ok := c.mapped.ReadMapped(p, off, req.vec[:0]); ok {
				req.vec, req.mapped = v, true
				c.reply(req, 0, -1, p)
				return
			}
		}
		var n int
		n, err = dev.ReadAt(p, off)
		if n == len(p) {
			err = nil // io.ReaderAt may report io.EOF with a full read at the end
		} else if err == nil {
			err = io.ErrUnexpectedEOF
		}
		if err == nil {
			c.reply(req, 0, -1, p)
			return
		}
		errOff = off + int64(min(max(n, 0), len(p)-1))
	case cmdWrite:
		if req.length == 0 {
			break
		}
		p := req.buf.mem[:req.length]
		var n int
		switch {
		case fua && c.fua != nil:
			n, err = c.fua.WriteAtFUA(p, off)
		case !fua && c.pinned != nil:
			// Stable pages: the device may keep p after the call; from here on nothing in the
			// server writes to it, and it returns to the pool only after the device's release.
			req.buf.pin(c.srv.debugImmutable)
			n, err = c.pinned.WritePinned(p, off, req.buf.release)
		default:
			n, err = dev.WriteAt(p, off)
		}
		if err == nil && n != len(p) {
			err = io.ErrShortWrite
		}
		if err == nil && fua && c.fua == nil {
			err = dev.Flush()
		}
	case cmdFlush:
		err = dev.Flush()
	case cmdTrim:
		err = dev.Trim(off, int64(req.length))
		if err == nil && fua {
			err = dev.Flush()
		}
	case cmdWriteZeroes:
		err = dev.WriteZeroes(off, int64(req.length), req.flags&cmdFlagNoHole != 0)
		if err == nil && fua {
			err = dev.Flush()
		}
	case cmdCache:
		// A hint; the Device interface has nothing to pass it to.
	case cmdBlockStatus:
		var wire []byte
		if wire, err = c.blockStatus(req); err == nil {
			c.reply(req, 0, -1, wire)
			return
		}
	}
	if err != nil {
		errno := errnoOf(err)
		c.log.Warn("nbd: request failed", "cmd", cmdName(req.typ), "offset", req.off,
			"length", req.length, "errno", errno, "err", err)
		c.reply(req, errno, errOff, nil)
		return
	}
	c.reply(req, 0, -1, nil)
}

// blockStatus answers a BLOCK_STATUS for base:allocation: it asks the Device (a BlockStatuser;
// any other device is all data) about at most maxBlockStatusLength bytes from req.off, keeps
// the extents that are well-formed and within the range, merges neighbours with the same
// flags, and returns the descriptors' wire form (at most maxBlockStatusExtents, or one with
// NBD_CMD_FLAG_REQ_ONE; the protocol lets a reply cover less than asked). The result lives in
// req until its reply is written.
func (c *conn) blockStatus(req *request) ([]byte, error) {
	length := min(int64(req.length), maxBlockStatusLength)
	limit := maxBlockStatusExtents
	if req.flags&cmdFlagReqOne != 0 {
		limit = 1
	}
	if req.extents == nil {
		req.extents = make([]Extent, 0, maxBlockStatusExtents)
		req.bsWire = make([]byte, 0, 8*maxBlockStatusExtents)
	}
	// The device gets room for every extent even under REQ_ONE: it may describe the range in
	// pieces finer than its runs (raid5d: chunk by chunk), merged below into the one sent.
	ext := append(req.extents[:0], Extent{Length: length})
	if bs, ok := c.sess.export.Device.(BlockStatuser); ok {
		var err error
		if ext, err = bs.BlockStatus(int64(req.off), length, req.extents[:0]); err != nil {
			return nil, err
		}
	}
	wire := req.bsWire[:0]
	var cur Extent // the extent being merged; Length 0 before the first
	covered := int64(0)
	for _, x := range ext {
		if x.Length <= 0 || x.Length > length-covered {
			break // a device that breaks its contract: keep what was sound
		}
		covered += x.Length
		x.Flags &= ExtentHole | ExtentZero
		if cur.Length > 0 && x.Flags == cur.Flags {
			cur.Length += x.Length
			continue
		}
		if cur.Length > 0 {
			if len(wire) == 8*limit {
				break
			}
			wire = appendExtent(wire, cur)
		}
		cur = x
	}
	switch {
	case cur.Length == 0:
		cur = Extent{Length: length} // nothing usable came back: data, which is always true
		fallthrough
	case len(wire) < 8*limit:
		wire = appendExtent(wire, cur)
	}
	return wire, nil
}

// appendExtent appends one block status descriptor: 32-bit length, 32-bit flags.
func appendExtent(b []byte, x Extent) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(x.Length))
	return binary.BigEndian.AppendUint32(b, uint32(x.Flags))
}

// encodeHeader encodes req's reply header into req.hdr: a simple reply without structured
// replies, else one chunk with NBD_REPLY_FLAG_DONE — OFFSET_DATA for a READ's data,
// BLOCK_STATUS for a BLOCK_STATUS, an error chunk (ERROR_OFFSET when errOff >= 0) for an
// error, NONE for everything else.
func (c *conn) encodeHeader(req *request, errno uint32, errOff int64, payload []byte) {
	if !c.sess.structured {
		encodeReply((*[replyHeaderSize]byte)(req.hdr[:]), errno, req.cookie)
		req.hdrLen = replyHeaderSize
		return
	}
	b := req.hdr[:]
	switch {
	case errno != 0:
		req.hdrLen = encodeErrorChunk(b, req.typ, req.cookie, errno, errOff)
	case req.typ == cmdRead && len(payload) > 0:
		encodeChunk(b, replyFlagDone, replyTypeOffsetData, req.cookie, uint32(8+len(payload)))
		binary.BigEndian.PutUint64(b[chunkHeaderSize:], req.off)
		req.hdrLen = chunkHeaderSize + 8
	case req.typ == cmdBlockStatus:
		encodeChunk(b, replyFlagDone, replyTypeBlockStatus, req.cookie, uint32(4+len(payload)))
		binary.BigEndian.PutUint32(b[chunkHeaderSize:], metaIDAllocation)
		req.hdrLen = chunkHeaderSize + 4
	default:
		encodeChunk(b, replyFlagDone, replyTypeNone, req.cookie, 0)
		req.hdrLen = chunkHeaderSize
	}
}

// encodeErrorChunk encodes a final error chunk into b and returns its length: the error, a
// message naming the command and the error, and the offset when errOff >= 0.
func encodeErrorChunk(b []byte, typ uint16, cookie uint64, errno uint32, errOff int64) int {
	msg := b[chunkHeaderSize+6 : chunkHeaderSize+6+maxErrorMessage]
	n := copy(msg, cmdName(typ))
	n += copy(msg[n:], ": ")
	n += copy(msg[n:], errnoText(errno))
	binary.BigEndian.PutUint32(b[chunkHeaderSize:], errno)
	binary.BigEndian.PutUint16(b[chunkHeaderSize+4:], uint16(n))
	payload := 6 + n
	typeOf := replyTypeError
	if errOff >= 0 {
		typeOf = replyTypeErrorOffset
		binary.BigEndian.PutUint64(b[chunkHeaderSize+payload:], uint64(errOff))
		payload += 8
	}
	encodeChunk(b, replyFlagDone, typeOf, cookie, uint32(payload))
	return chunkHeaderSize + payload
}

// reply queues req's reply (the header, and the payload of a successful READ or BLOCK_STATUS;
// errOff for a failed READ, else -1) and, unless another worker is writing replies, writes the
// queue itself: each batch of queued replies in one writev, until none is left. req is
// released after its reply is written (or dropped, after a failed write); the caller must not
// touch it again.
func (c *conn) reply(req *request, errno uint32, errOff int64, payload []byte) {
	c.encodeHeader(req, errno, errOff, payload)
	req.payload = payload
	c.qmu.Lock()
	c.replyQ = append(c.replyQ, req)
	others := c.serving.Add(-1) > 0
	if c.writing {
		c.qmu.Unlock()
		return // the writer will pick it up before it stops
	}
	c.writing = true
	if len(c.replyQ) == 1 && others {
		// Other requests are being performed and will reply soon: yield once so that their
		// replies can join this one in a single writev. On loopback a send costs the sender
		// the receiver's TCP work too, so fewer, larger writes are cheaper: 4 KiB random
		// writes through fio ran 1.12× faster at 0.9× the CPU per request, 4 KiB random
		// reads 1.03× at 0.95× (medians of 3 alternating runs of test/bench/peers.sh). A lone
		// request (queue depth 1) never waits.
		c.qmu.Unlock()
		runtime.Gosched()
		c.qmu.Lock()
	}
	for len(c.replyQ) > 0 {
		batch := c.replyQ
		c.replyQ, c.spareQ = c.spareQ[:0], nil
		c.qmu.Unlock()

		c.writeBatch(batch)
		for i, r := range batch {
			c.release(r)
			batch[i] = nil
		}

		c.qmu.Lock()
		c.spareQ = batch[:0]
	}
	c.writing = false
	c.qmu.Unlock()
}

// writeBatch writes the replies of batch with one writev (Go splits it only past 1024 iovecs
// or on a short write), unless an earlier write failed. Called by the writer only.
func (c *conn) writeBatch(batch []*request) {
	v := c.iovs[:0]
	for _, r := range batch {
		v = append(v, r.hdr[:r.hdrLen])
		switch {
		case r.mapped:
			v = append(v, r.vec...)
		case len(r.payload) > 0:
			v = append(v, r.payload)
		}
	}
	c.iovs = v
	c.wbufs = v
	c.writeMu.Lock()
	if c.writeErr == nil {
		c.setWriteDeadline()
		if _, err := c.wbufs.WriteTo(c.nc); err != nil {
			c.failWrite(err)
		}
	}
	c.writeMu.Unlock()
	clear(v) // drop the references to the payloads, which go back to the pool
	c.wbufs = nil
}

// replyFromReader writes an error reply for a request h the reader refused: a simple reply,
// or an error chunk once structured replies are on (never a simple reply to a READ then).
func (c *conn) replyFromReader(h *protocol.TransmissionRequestHeader, errno uint32) {
	c.writeMu.Lock()
	if c.writeErr == nil {
		n := replyHeaderSize
		if c.sess.structured {
			n = encodeErrorChunk(c.errHdr[:], h.Type, h.Handle, errno, -1)
		} else {
			encodeReply((*[replyHeaderSize]byte)(c.errHdr[:]), errno, h.Handle)
		}
		c.setWriteDeadline()
		if _, err := c.nc.Write(c.errHdr[:n]); err != nil {
			c.failWrite(err)
		}
	}
	c.writeMu.Unlock()
}

// setWriteDeadline bounds the reply write about to start by Options.ReplyTimeout, or by the
// deadline shutdown set if that is earlier: a client that stops reading cannot hold the
// writer, and with it every reply and buffer of the connection, for ever. Called with writeMu
// held.
func (c *conn) setWriteDeadline() {
	d := time.Now().Add(c.srv.replyTimeout)
	if s := c.shutdownAt.Load(); s != 0 && s < d.UnixNano() {
		d = time.Unix(0, s)
	}
	c.raw.SetWriteDeadline(d)
}

// failWrite records the first reply write error and stops the reader: a stream with a partial
// reply in it is lost. Called with writeMu held.
func (c *conn) failWrite(err error) {
	c.writeErr = err
	c.stopReading()
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isClosed reports whether err means the peer went away rather than misbehaved.
func isClosed(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		(errors.As(err, &ne) && ne.Timeout())
}
