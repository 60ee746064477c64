package nbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// conn is one client connection in the transmission phase. Its reader (the goroutine running
// ServeConn) reads requests (request.go), takes their buffers from the connection's pool
// (pool.go) and hands them to workers; workers call the Device (serveRequest) and write the
// replies (reply.go).
type conn struct {
	srv *Server
	nc  net.Conn      // the connection, or the TLS session on it after STARTTLS
	raw net.Conn      // the connection itself, for deadlines (they apply under TLS as well)
	br  *bufio.Reader // owned by the reader goroutine
	log *slog.Logger

	sess   *session
	fua    FUAWriter     // the export's Device as a FUAWriter, or nil
	pinned PinnedWriter  // the export's Device as a PinnedWriter if StablePages is on, or nil
	mapped MappedReader  // the export's Device as a MappedReader if MappedReads is on, or nil
	placed placedReader  // the export's Device as a PlacedWriter, and the socket (placed.go)
	cached CachedWriter  // the export's Device as a CachedWriter, or nil
	expect WriteExpecter // the export's Device as a WriteExpecter, or nil

	replies // the reply side: reply.go
	buffers // the in-flight bounds and the buffer pool: pool.go

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
	pinned     bool    // a WRITE's buf was pinned by the reader already (writeCached)

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
	c.cached, _ = sess.export.Device.(CachedWriter)
	c.expect, _ = sess.export.Device.(WriteExpecter)
	if pw, ok := sess.export.Device.(PlacedWriter); ok && c.nc == c.raw { // not under TLS: see PlacedWriter
		c.placed.init(pw, c.raw)
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
	c.logEnd(ctx, err, werr)
}

// readRequests is the reader's loop: it reads each request's header, checks it, takes a
// request and its buffer from the pool, reads a WRITE's payload into the buffer, and hands
// the request to the workers. A request it refuses is answered at once. It returns nil on
// NBD_CMD_DISC, else why it stopped: a read error, ErrBadRequestMagic, ErrPayloadTooLarge or
// a *payloadTimeoutError.
func (c *conn) readRequests() error {
	var hb [wire.RequestHeaderSize]byte
	direct := false // the last request was a large WRITE: see readHeader
	defer c.flushDeferred()
	for {
		if !c.placed.keep {
			c.flushDeferred() // the header may not be here yet: answer the held writes first
		}
		c.placed.keep = false
		h, err := c.readHeader(&hb, direct)
		if err != nil {
			return err
		}
		errno, err := checkRequest(&h, c.sess)
		if err != nil {
			return err
		}
		if h.Type == wire.CmdDisc {
			return nil
		}
		if errno != 0 {
			if err := c.refuse(&h, errno, nil); err != nil {
				return err
			}
			continue
		}
		if h.Type == wire.CmdWrite && h.Length >= placedMin && h.CommandFlags&wire.CmdFlagFUA == 0 && c.placed.pw != nil {
			placed, err := c.writePlaced(&h) // the payload read straight into the device: placed.go
			if err != nil {
				return err
			}
			if placed {
				direct = true
				continue
			}
		}
		if !c.admitsNow(&h) {
			c.flushDeferred() // before waiting for the in-flight bound or a payload
		}
		req, err := c.acquire(&h)
		if err != nil {
			// No memory for the buffer: refuse this request, keep the stream in sync.
			if err := c.refuse(&h, wire.EIO, err); err != nil {
				return err
			}
			continue
		}
		direct = false
		if h.Type == wire.CmdWrite && h.Length > 0 {
			if c.expect != nil {
				// Announced once admitted, not before: a write held at the in-flight bound
				// may wait for buffers the device keeps until it writes out what waits for it.
				c.expect.ExpectWrite(int64(h.Offset), int64(h.Length))
			}
			if err := c.readPayload(req); err != nil {
				c.release(req)
				return err
			}
			direct = h.Length >= directReadMin
		}
		c.serving.Add(1)
		if c.writeCached(req) {
			continue
		}
		c.work <- req // never blocks: acquire keeps inflight <= cap(c.work)
	}
}

// logEnd logs why the connection's transmission phase ended: err from readRequests, werr the
// first failed reply write.
func (c *conn) logEnd(ctx context.Context, err, werr error) {
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
	fua := req.flags&wire.CmdFlagFUA != 0
	errOff := int64(-1) // where a failed READ failed, for NBD_REPLY_TYPE_ERROR_OFFSET
	var err error
	switch req.typ {
	case wire.CmdRead:
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
	case wire.CmdWrite:
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
			if !req.pinned {
				req.buf.pin(c.srv.debugImmutable)
			}
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
	case wire.CmdFlush:
		err = dev.Flush()
	case wire.CmdTrim:
		err = dev.Trim(off, int64(req.length))
		if err == nil && fua {
			err = dev.Flush()
		}
	case wire.CmdWriteZeroes:
		err = dev.WriteZeroes(off, int64(req.length), req.flags&wire.CmdFlagNoHole != 0)
		if err == nil && fua {
			err = dev.Flush()
		}
	case wire.CmdCache:
		// A hint; the Device interface has nothing to pass it to.
	case wire.CmdBlockStatus:
		var wire []byte
		if wire, err = c.blockStatus(req); err == nil {
			c.reply(req, 0, -1, wire)
			return
		}
	}
	if err != nil {
		errno := errnoOf(err)
		c.log.Warn("nbd: request failed", "cmd", wire.CmdName(req.typ), "offset", req.off,
			"length", req.length, "errno", errno, "err", err)
		c.reply(req, errno, errOff, nil)
		return
	}
	c.reply(req, 0, -1, nil)
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
