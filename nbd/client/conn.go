package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// Options configure a Conn.
type Options struct {
	// MaxInFlight bounds the requests outstanding on the connection; more concurrent calls wait
	// for a slot. Zero means DefaultMaxInFlight.
	MaxInFlight int
	// Dialer dials the server; nil means a zero net.Dialer.
	Dialer *net.Dialer
	// TLSConfig, when set, upgrades the connection with NBD_OPT_STARTTLS before the export is
	// negotiated (see LoadTLSConfig). Dial needs an nbds URI for it, and with an nbds URI and
	// no TLSConfig verifies the server against the system's CAs. Dial fills in ServerName
	// from the URI when it is empty ("localhost" for a unix socket); TLS 1.2 is the minimum.
	TLSConfig *tls.Config
	// Counters, when set, counts the connection's batches and reads (share one among the
	// connections to a server to count them all).
	Counters *Counters
}

// Counters count what a Conn's system calls carry, for metrics: with many requests in flight
// a batch should carry several (README, issue 17: one request per system call is the slow
// mode). Every field only grows; read them with Load.
type Counters struct {
	// WriteBatches counts the batches of requests written (one writev each, unless the socket
	// takes less), RequestsWritten the requests in them.
	WriteBatches, RequestsWritten atomic.Uint64
	// ReplyReads counts the reply reader's reads from the socket (those that found it empty
	// included; over TLS none are counted), Replies the replies it read.
	ReplyReads, Replies atomic.Uint64
}

// Conn is one NBD connection in the transmission phase. It is safe for concurrent use; see the
// package documentation.
type Conn struct {
	nc   net.Conn
	info exportInfo
	ctr  *Counters // Options.Counters, or the Conn's own

	// Requests are queued and written in batches: the caller that finds no writer active
	// becomes the writer and sends everything queued, in one writev per batch, until the queue
	// is empty; the others just queue and wait for their replies.
	wmu     sync.Mutex  // guards wq, wspare, writing, werr
	wq      []wreq      // requests waiting to be written
	wspare  []wreq      // the other queue array, swapped with wq per batch
	writing bool        // a caller is writing; only it touches iov
	werr    error       // the write error that broke the connection
	wcond   *sync.Cond  // on wmu: signalled when writing turns false
	iov     [][]byte    // the writer's scratch for a batch
	wbufs   net.Buffers // the writer's: iov as WriteTo consumes it

	smu        sync.Mutex // guards slots' seq, active, cmd, buf, and readerGone
	slots      []slot
	readerGone bool        // the reply reader has returned
	free       chan uint32 // indices of free slots

	dead      chan struct{} // closed when the connection is broken or closed
	deadErr   error         // why; written once before dead is closed
	deadOnce  sync.Once
	closeOnce sync.Once
	closing   atomic.Bool   // set by Close: the reader's socket error is then expected
	readerEnd chan struct{} // closed when the reply reader has returned
}

// wreq is a request waiting to be written: its header and, for a WRITE, the caller's payload
// (payload, or the buffers of payloads one after another).
type wreq struct {
	hdr      [wire.RequestHeaderSize]byte
	payload  []byte
	payloads [][]byte
}

// slot is one request in flight. Its cookie is seq<<32 | index, so a late reply for an earlier
// use of the slot is caught, and a duplicated one because the reader clears active when it
// takes the first.
type slot struct {
	seq    uint32
	active bool // awaiting its reply
	cmd    uint16
	buf    []byte      // READ destination
	bufs   [][]byte    // or its buffers, filled one after another
	done   chan uint32 // errno of the reply, or errnoBroken
}

// errnoBroken, sent on a slot's done channel, means the connection broke before the reply.
const errnoBroken = ^uint32(0)

// Dial connects to the export named by an NBD URI (see ParseURI) and completes the handshake,
// upgrading to TLS first for an nbds or nbds+unix URI. ctx bounds the dial and the handshake.
func Dial(ctx context.Context, uri string, opts Options) (*Conn, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	switch {
	case u.TLS:
		conf := opts.TLSConfig
		if conf == nil {
			conf = &tls.Config{}
		}
		if conf.ServerName == "" {
			conf = conf.Clone()
			conf.ServerName = u.serverName()
		}
		opts.TLSConfig = conf
	case opts.TLSConfig != nil:
		return nil, fmt.Errorf("%w: %q: a TLS configuration given for a plaintext URI (use nbds:// or nbds+unix://)", ErrBadURI, uri)
	}
	d := opts.Dialer
	if d == nil {
		d = &net.Dialer{}
	}
	nc, err := d.DialContext(ctx, u.Network, u.Address)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c, err := NewConn(ctx, nc, u.Export, opts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// NewConn runs the handshake for export on an established connection and returns the Conn,
// which owns nc from then on (Close closes it). With opts.TLSConfig set it first upgrades nc to
// TLS (the config must name the server, or skip verification). ctx bounds the handshake. On
// error nc is left open for the caller to close.
func NewConn(ctx context.Context, nc net.Conn, export string, opts Options) (*Conn, error) {
	conf := opts.TLSConfig
	if conf != nil && conf.MinVersion < tls.VersionTLS12 {
		conf = conf.Clone()
		conf.MinVersion = tls.VersionTLS12
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(aLongTimeAgo) })
	br := bufio.NewReaderSize(nc, 64<<10)
	info, tnc, br, err := handshake(ctx, br, nc, export, conf)
	if !stop() {
		return nil, fmt.Errorf("client: handshake: %w", context.Cause(ctx))
	}
	if err != nil {
		return nil, err
	}
	n := opts.MaxInFlight
	if n <= 0 {
		n = DefaultMaxInFlight
	}
	c := &Conn{
		nc: tnc, info: info,
		slots:     make([]slot, n),
		free:      make(chan uint32, n),
		dead:      make(chan struct{}),
		readerEnd: make(chan struct{}),
	}
	c.ctr = opts.Counters
	if c.ctr == nil {
		c.ctr = new(Counters)
	}
	c.wq, c.wspare = make([]wreq, 0, n+1), make([]wreq, 0, n+1)
	c.wcond = sync.NewCond(&c.wmu)
	for i := range c.slots {
		c.slots[i].done = make(chan uint32, 1)
		c.free <- uint32(i)
	}
	go c.readReplies(newReplyReader(tnc, br, &c.ctr.ReplyReads))
	return c, nil
}

// Done returns a channel that is closed once the connection is broken or closed: every request
// from then on fails (Err says why).
func (c *Conn) Done() <-chan struct{} { return c.dead }

// Err returns nil while the connection works, and once Done is closed the error, wrapping
// ErrDisconnected, that every request now fails with.
func (c *Conn) Err() error {
	select {
	case <-c.dead:
		return c.deadErr
	default:
		return nil
	}
}

// Size returns the export size in bytes (it never changes during a connection). The error is
// always nil; the signature matches nbd.Device.
func (c *Conn) Size() (int64, error) { return c.info.size, nil }

// Flags returns the transmission flags the server sent (FlagReadOnly, FlagSendFlush, ...).
func (c *Conn) Flags() uint16 { return c.info.flags }

// ExportName returns the name the server reported for the export (NBD_INFO_NAME, its canonical
// name: for the default export "" the one it stands for), or "" if the server sent none.
func (c *Conn) ExportName() string { return c.info.name }

// BlockSize returns the server's minimum, preferred and maximum block sizes (1, 4096 and
// 32 MiB when it sent none).
func (c *Conn) BlockSize() (minimum, preferred, maximum uint32) {
	return c.info.minBlock, c.info.prefBlock, c.info.maxBlock
}

// ReadAt reads len(p) bytes at off, as io.ReaderAt: n is len(p) or 0, with an error.
func (c *Conn) ReadAt(p []byte, off int64) (int, error) {
	if err := c.checkData(wire.CmdRead, off, len(p)); err != nil {
		return 0, err
	}
	if err := c.do(wire.CmdRead, 0, off, uint32(len(p)), p, nil); err != nil {
		return 0, err
	}
	return len(p), nil
}

// ReadvAt reads into bufs, one after another, the bytes from off on, in one READ of their
// total length (which the server's maximum block size bounds: ErrTooLarge), its payload read
// straight into them: n is the total or 0, with an error.
func (c *Conn) ReadvAt(bufs [][]byte, off int64) (int, error) {
	n := buffersLen(bufs)
	if err := c.checkData(wire.CmdRead, off, n); err != nil {
		return 0, err
	}
	if err := c.do(wire.CmdRead, 0, off, uint32(n), nil, bufs); err != nil {
		return 0, err
	}
	return n, nil
}

// WritevAt writes bufs, one after another, from off on, in one WRITE of their total length
// (bounded as ReadvAt's), as WriteAt writes.
func (c *Conn) WritevAt(bufs [][]byte, off int64) (int, error) {
	if c.info.flags&FlagReadOnly != 0 {
		return 0, ErrReadOnly
	}
	n := buffersLen(bufs)
	if err := c.checkData(wire.CmdWrite, off, n); err != nil {
		return 0, err
	}
	if err := c.do(wire.CmdWrite, 0, off, uint32(n), nil, bufs); err != nil {
		return 0, err
	}
	return n, nil
}

func buffersLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

// WriteAt writes p at off, as io.WriterAt. The write is complete (later reads see it) but
// durable only after a Flush.
func (c *Conn) WriteAt(p []byte, off int64) (int, error) {
	return c.write(p, off, 0)
}

// WriteAtFUA writes p at off with NBD_CMD_FLAG_FUA: durable when it returns. It returns
// ErrUnsupported if the server did not advertise FUA.
func (c *Conn) WriteAtFUA(p []byte, off int64) (int, error) {
	if c.info.flags&FlagSendFUA == 0 {
		return 0, fmt.Errorf("%w: FUA (NBD_FLAG_SEND_FUA not set)", ErrUnsupported)
	}
	return c.write(p, off, wire.CmdFlagFUA)
}

func (c *Conn) write(p []byte, off int64, flags uint16) (int, error) {
	if c.info.flags&FlagReadOnly != 0 {
		return 0, ErrReadOnly
	}
	if err := c.checkData(wire.CmdWrite, off, len(p)); err != nil {
		return 0, err
	}
	if err := c.do(wire.CmdWrite, flags, off, uint32(len(p)), p, nil); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush makes every write completed before it was sent durable.
func (c *Conn) Flush() error {
	if c.info.flags&FlagSendFlush == 0 {
		return fmt.Errorf("%w: FLUSH (NBD_FLAG_SEND_FLUSH not set)", ErrUnsupported)
	}
	return c.do(wire.CmdFlush, 0, 0, 0, nil, nil)
}

// Trim tells the server the range is no longer needed.
func (c *Conn) Trim(off, length int64) error {
	if err := c.checkRange(FlagSendTrim, off, length); err != nil {
		return err
	}
	return c.do(wire.CmdTrim, 0, off, uint32(length), nil, nil)
}

// WriteZeroes makes the range read back as zeroes; with noHole the server must allocate it.
func (c *Conn) WriteZeroes(off, length int64, noHole bool) error {
	if err := c.checkRange(FlagSendWriteZeroes, off, length); err != nil {
		return err
	}
	var f uint16
	if noHole {
		f = wire.CmdFlagNoHole
	}
	return c.do(wire.CmdWriteZeroes, f, off, uint32(length), nil, nil)
}

func (c *Conn) checkData(cmd uint16, off int64, n int) error {
	if off < 0 || int64(n) > c.info.size-off {
		return fmt.Errorf("%w: %s of %d bytes at %d, export is %d bytes", ErrRange, wire.CmdName(cmd), n, off, c.info.size)
	}
	if uint64(n) > uint64(c.info.maxBlock) {
		return fmt.Errorf("%w: %s of %d bytes, maximum %d", ErrTooLarge, wire.CmdName(cmd), n, c.info.maxBlock)
	}
	return nil
}

func (c *Conn) checkRange(flag uint16, off, length int64) error {
	if c.info.flags&FlagReadOnly != 0 {
		return ErrReadOnly
	}
	if c.info.flags&flag == 0 {
		return fmt.Errorf("%w: flag %#x not advertised", ErrUnsupported, flag)
	}
	if off < 0 || length < 0 || length > c.info.size-off || length > 1<<32-1 {
		return fmt.Errorf("%w: %d bytes at %d, export is %d bytes", ErrRange, length, off, c.info.size)
	}
	return nil
}

// do sends one request and waits for its reply. For a WRITE, buf is the payload; for a READ,
// the destination.
func (c *Conn) do(cmd, flags uint16, off int64, length uint32, buf []byte, bufs [][]byte) error {
	var idx uint32
	select {
	case idx = <-c.free:
	case <-c.dead:
		return c.notSent()
	}
	c.smu.Lock()
	if c.readerGone {
		c.smu.Unlock()
		c.free <- idx
		return c.notSent()
	}
	s := &c.slots[idx]
	s.seq++
	s.active, s.cmd = true, cmd
	if cmd == wire.CmdRead {
		s.buf, s.bufs = buf, bufs
	}
	cookie := uint64(s.seq)<<32 | uint64(idx)
	c.smu.Unlock()

	var r wreq
	wire.PutRequest(&r.hdr, flags, cmd, cookie, uint64(off), length)
	if cmd == wire.CmdWrite {
		r.payload, r.payloads = buf, bufs
	}
	sent := c.send(&r)

	errno := <-s.done // the reader answers every active slot exactly once, if only at its end
	c.smu.Lock()
	s.active, s.buf, s.bufs = false, nil, nil
	c.smu.Unlock()
	c.free <- idx
	switch errno {
	case 0:
		return nil
	case errnoBroken:
		// The writer may still hold buf in a batch that is failing; the caller may reuse
		// buf only once it has let go.
		c.waitWriterIdle()
		if !sent {
			return c.notSent()
		}
		return c.deadErr
	}
	return &Error{Cmd: wire.CmdName(cmd), Offset: off, Length: int64(length), Errno: errno}
}

// notSent is the error of a request refused before any of it was written: the connection
// was already broken.
func (c *Conn) notSent() error { return fmt.Errorf("%w: %w", ErrNotSent, c.deadErr) }

// yieldBelow is the queue length below which the caller that becomes the writer yields the
// processor once before it takes the batch. Measured (test/bench/netns.sh, against the same
// binary without the yield, two runs, load 11-14): remote 4 KiB random writes 1.64× and
// 1.29×, reads 1.29× and 0.85×, 1 MiB writes 1.07×; over loopback with serve's CPU counted,
// 4 KiB reads 1.49× at 0.62× the CPU per read, writes 1.14× at 0.98×.
const yieldBelow = 4

// send queues r and, unless another caller is writing, writes the queue until it is empty.
// A write error breaks the connection (the reader then fails every request in flight). It
// returns false, queueing nothing, if an earlier write error has broken the connection already.
func (c *Conn) send(r *wreq) bool {
	c.wmu.Lock()
	if c.werr != nil {
		c.wmu.Unlock()
		return false
	}
	c.wq = append(c.wq, *r)
	if c.writing {
		c.wmu.Unlock()
		return true
	}
	c.writing = true
	if len(c.wq) < yieldBelow {
		// Let the callers about to send (requests in flight together are issued by many
		// goroutines at once) queue theirs into this batch: fewer writev(2) calls.
		c.wmu.Unlock()
		runtime.Gosched()
		c.wmu.Lock()
	}
	for len(c.wq) > 0 && c.werr == nil {
		batch := c.wq
		c.wq = c.wspare[:0]
		c.wmu.Unlock()

		iov := c.iov[:0]
		for i := range batch {
			iov = append(iov, batch[i].hdr[:])
			if len(batch[i].payload) > 0 {
				iov = append(iov, batch[i].payload)
			}
			for _, b := range batch[i].payloads {
				if len(b) > 0 {
					iov = append(iov, b)
				}
			}
		}
		c.wbufs = iov
		_, err := c.wbufs.WriteTo(c.nc)
		c.ctr.WriteBatches.Add(1)
		c.ctr.RequestsWritten.Add(uint64(len(batch)))
		clear(iov) // keep no caller's buffer
		c.iov = iov[:0]
		clear(batch)

		c.wmu.Lock()
		c.wspare = batch[:0]
		if err != nil {
			c.werr = err
		}
	}
	c.wq = c.wq[:0] // after a write error nothing more is sent
	c.writing = false
	c.wcond.Broadcast()
	err := c.werr
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("%w: writing requests: %v", ErrDisconnected, err))
	}
	return true
}

// waitWriterIdle returns when no batch is being written.
func (c *Conn) waitWriterIdle() {
	c.wmu.Lock()
	for c.writing {
		c.wcond.Wait()
	}
	c.wmu.Unlock()
}

// readReplies reads replies until the connection breaks, handing each to its slot.
func (c *Conn) readReplies(rr *replyReader) {
	defer close(c.readerEnd)
	defer c.endReader()
	var h [wire.ReplyHeaderSize]byte
	for {
		if err := rr.readFull(h[:]); err != nil {
			if c.closing.Load() {
				err = errors.New("closed by Close")
			}
			c.fail(fmt.Errorf("%w: reading replies: %v", ErrDisconnected, err))
			return
		}
		c.ctr.Replies.Add(1)
		rh := wire.DecodeReply(&h)
		magic, errno, cookie := rh.ReplyMagic, rh.Error, rh.Handle
		if magic != wire.MagicSimpleReply {
			c.fail(fmt.Errorf("%w: reply magic %#x (structured replies were not negotiated)", ErrDisconnected, magic))
			return
		}
		idx, seq := uint32(cookie), uint32(cookie>>32)
		c.smu.Lock()
		var s *slot
		if idx < uint32(len(c.slots)) && c.slots[idx].active && c.slots[idx].seq == seq {
			s = &c.slots[idx]
			// Taken: a second reply with this cookie (a server answering twice) finds the
			// slot inactive and breaks the connection, rather than answer the next request
			// that reuses the slot or land in a buffer its caller has been given back.
			s.active = false
		}
		var dst []byte
		var dsts [][]byte
		if s != nil && s.cmd == wire.CmdRead && errno == 0 {
			dst, dsts = s.buf, s.bufs
		}
		c.smu.Unlock()
		if s == nil {
			c.fail(fmt.Errorf("%w: reply with unknown cookie %#x", ErrDisconnected, cookie))
			return
		}
		if errno == errnoBroken {
			errno = wire.EIO // keep the sentinel value ours
		}
		if err := rr.readPayload(dst, dsts); err != nil {
			c.fail(fmt.Errorf("%w: reading READ payload: %v", ErrDisconnected, err))
			s.done <- errnoBroken // taken, so endReader no longer answers it
			return
		}
		rr.direct(len(dst)+buffersLen(dsts) >= directMin)
		s.done <- errno
	}
}

// fail marks the connection broken with err (the first cause wins) and closes the socket, so
// the reader stops; the reader then answers every request still in flight.
func (c *Conn) fail(err error) {
	c.deadOnce.Do(func() {
		c.deadErr = err
		close(c.dead)
		c.nc.Close()
	})
}

// endReader runs when the reader returns: no reply will come for any slot, so each active one
// is answered with errnoBroken, and do refuses new requests from now on.
func (c *Conn) endReader() {
	c.smu.Lock()
	defer c.smu.Unlock()
	c.readerGone = true
	for i := range c.slots {
		if s := &c.slots[i]; s.active && len(s.done) == 0 {
			s.done <- errnoBroken
		}
	}
}

// Close sends NBD_CMD_DISC, closes the connection and waits for the reply reader to end.
// Requests still in flight fail with ErrDisconnected. Close is idempotent; it returns the error
// of sending DISC, if any.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		select {
		case <-c.dead:
		default:
			var r wreq
			wire.PutRequest(&r.hdr, 0, wire.CmdDisc, 0, 0, 0)
			c.send(&r)
			c.waitWriterIdle()
			c.wmu.Lock()
			err = c.werr
			c.wmu.Unlock()
		}
		c.fail(fmt.Errorf("%w: closed by Close", ErrDisconnected))
		<-c.readerEnd
	})
	return err
}

// aLongTimeAgo is a deadline in the past: pending and future I/O fail at once.
var aLongTimeAgo = time.Unix(1, 0)
