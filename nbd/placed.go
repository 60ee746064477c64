package nbd

import (
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"

	"github.com/pojntfx/go-nbd/pkg/protocol"
	"github.com/raid5d/raid5d/nbd/internal/wire"
	"golang.org/x/sys/unix"
)

// placedMin is the shortest WRITE the reader offers the device to place (PlacedWriter): below
// it the check of the socket's receive queue costs about what the copy it saves does.
const placedMin = 16 << 10

// maxPlacedIov bounds the iovecs of one readv (the kernel's IOV_MAX).
const maxPlacedIov = 1024

// placedStep is about how many bytes of a piece one readv reads when the device works on a
// piece as it arrives (PlacedProgresser: raid5d's parity): few enough that they are still in
// the CPU's cache when the device reads them back, as the whole of a 1 MiB piece was not (the
// parity's XOR reading it back took 12% of the daemon's CPU), at a system call per step.
var placedStep int64 = 192 << 10 // a variable for the tests

// placedReader is the reader's state for placed writes: the device, the socket's raw
// descriptor, and scratch reused from WRITE to WRITE. The callbacks given to the raw
// descriptor are bound once (init), so a placed write allocates nothing.
type placedReader struct {
	pw   PlacedWriter     // nil: no placed writes on this connection
	unit int64            // pw.PlaceUnit()
	prog PlacedProgresser // pw, if it is one
	step int              // with prog: the bytes of one readv, whole units
	rc   syscall.RawConn
	vec  [][]byte
	iov  []unix.Iovec
	// Replies of placed writes held back to go out with the next ones (deferReply), and
	// whether the reader may read the next request before writing them: the bytes known to
	// have arrived after the last placed payload hold a whole request header.
	deferred []*request
	keep     bool
	avail    int // arrived's count: bytes buffered and in the receive queue
	inq      int // inqFn's answer
	// known is how many bytes the receive queue is known to hold: the last SIOCINQ's answer
	// less what was read from the socket since (a lower bound, as arrivals only add to the
	// queue). Anything but a placed read that reads the socket sets it to 0 (forget), so
	// that a run of placed WRITEs asks SIOCINQ once per many requests, not once per piece.
	known int
	// next holds what the last placed read took of the next request's header with the
	// payload's last bytes, nextN bytes of it (as many as had arrived): readHeader reads only
	// the rest, usually nothing.
	next   [wire.RequestHeaderSize]byte
	nextN  int
	rn     int   // readvFn's answer
	rerr   error // readvFn's error
	want   int   // waitFn's goal: bytes that must have arrived
	noWait int   // WRITEs to go before awaitPiece waits again (after a wait timed out)
	// inqFn, readvFn and waitFn are the callbacks for rc.Control and rc.Read.
	inqFn   func(fd uintptr)
	readvFn func(fd uintptr) bool
	waitFn  func(fd uintptr) bool
}

// init enables placed writes to pw on nc, if nc exposes its descriptor.
func (p *placedReader) init(pw PlacedWriter, nc net.Conn) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	if p.unit = pw.PlaceUnit(); p.unit <= 0 {
		return
	}
	p.pw, p.rc = pw, rc
	if p.prog, _ = pw.(PlacedProgresser); p.prog != nil {
		p.step = int(max(1, placedStep/p.unit) * p.unit)
	}
	p.inqFn = func(fd uintptr) {
		q, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			q = 0
		}
		p.inq = q
	}
	p.waitFn = func(fd uintptr) bool {
		p.inqFn(fd)
		p.known = p.inq
		return p.avail+p.inq >= p.want
	}
	p.readvFn = func(fd uintptr) bool {
		for {
			r, _, errno := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p.iov))), uintptr(len(p.iov)))
			switch errno {
			case 0:
				p.rn, p.rerr = int(r), nil
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false // wait until readable (the payload has arrived, so rarely)
			default:
				p.rn, p.rerr = 0, errno
			}
			return true
		}
	}
}

// arrived reports whether n bytes of payload have arrived: in the buffered reader, or also in
// the socket's receive queue (SIOCINQ, which known then remembers).
func (c *conn) arrived(n int) bool {
	p := &c.placed
	p.avail = c.br.Buffered()
	if p.avail >= n {
		return true
	}
	if err := p.rc.Control(p.inqFn); err != nil {
		return false
	}
	p.known = p.inq
	p.avail += p.inq
	return p.avail >= n
}

// forget drops what the reader knew of the receive queue (known): the socket was read by
// other than a placed read.
func (p *placedReader) forget() { p.known = 0 }

// nextArrived reports whether the next request's header is known to have arrived: read ahead
// (next), in the buffered reader, or in the receive queue as far as known. It asks the socket
// nothing: a SIOCINQ per request costs more than the replies' sends it saves.
func (c *conn) nextArrived() bool {
	p := &c.placed
	return wire.RequestHeaderSize-p.nextN <= c.br.Buffered()+p.known
}

// A piece of a WRITE that has not all arrived is waited for, without anything held, for at
// most placedWait, and only if it is at most placedWaitMax long (a receive queue holds that
// much long before it fills; a longer piece might never fit while the client waits for room).
// A wait that times out (the client is slow, or the queue is small) turns waiting off for the
// connection's next placedNoWait WRITEs: such a client is served as usual rather than delayed.
const (
	placedWaitMax = 256 << 10
	placedNoWait  = 64
)

var placedWait = 2 * time.Millisecond // a variable for the tests

// awaitPiece reports whether n bytes of payload have arrived (arrived), waiting a little for
// them (placedWait) when that is worth it.
func (c *conn) awaitPiece(n int) bool {
	if c.arrived(n) {
		return true
	}
	p := &c.placed
	if n > placedWaitMax || p.noWait > 0 {
		return false
	}
	p.want = n
	p.avail = c.br.Buffered() // unchanged while the reader waits: the reader is us
	c.setReadDeadline(time.Now().Add(placedWait))
	err := p.rc.Read(p.waitFn)
	c.setReadDeadline(time.Time{})
	if err != nil { // timed out, or the reader was stopped (its next read says so)
		p.noWait = placedNoWait
		return false
	}
	p.avail += p.inq
	return true
}

// maxDeferred bounds the placed writes whose replies wait for the next one (deferReply): a
// few, so that a deep queue of writes is answered in few writevs, and always fewer than the
// connection's in-flight bound, which counts them.
const maxDeferred = 16

// deferReply holds back the reply of the placed write req (its header encoded) when the next
// request has already arrived (nextArrived) and fewer than maxDeferred replies are held: the
// reader is about to read it without waiting, and the replies go out together afterwards
// (flushDeferred). Otherwise it writes the held replies and req's now. On loopback a send
// costs about what a 48 KiB placed write's parity does.
func (c *conn) deferReply(req *request) {
	p := &c.placed
	p.deferred = append(p.deferred, req)
	if len(p.deferred) < min(maxDeferred, c.srv.maxInFlightReqs-1) && c.nextArrived() {
		p.keep = true
		return
	}
	c.flushDeferred()
}

// flushDeferred writes the replies deferReply held back. The reader calls it before anything
// that may wait (a header that has not arrived, a payload, the in-flight bound) and when it
// stops, so a held reply never waits for the client.
func (c *conn) flushDeferred() {
	p := &c.placed
	p.keep = false
	if len(p.deferred) == 0 {
		return
	}
	c.replyAll(p.deferred)
	clear(p.deferred)
	p.deferred = p.deferred[:0]
}

// writePlaced performs the WRITE h (no FUA, at least placedMin bytes) with its payload read
// straight into the device (PlacedWriter), as much of it as it can, and reports whether it
// did; the reply goes out as a worker's would. It places the WRITE in pieces of whole units
// (PlaceUnit) whose bytes have all arrived, or arrive after a short wait (awaitPiece); the rest
// of a WRITE it cannot place (a piece did not arrive in time, or the device declined it) goes
// to a worker as an ordinary WRITE of the remaining range, which replies for the whole. With
// nothing placed it reports false and the caller writes as usual. An error is a failed read of
// the payload (the connection ends; the device has made the range consistent).
func (c *conn) writePlaced(h *protocol.TransmissionRequestHeader) (bool, error) {
	p := &c.placed
	if p.noWait > 0 {
		p.noWait--
	}
	off, n, u := int64(h.Offset), int(h.Length), p.unit
	if (off+u-1)/u*u+u > off+int64(n) {
		return false, nil // no whole unit in it: nothing to wait for
	}
	if c.br.Buffered() > 0 {
		// The buffered reader holds the payload's start (read with the request before):
		// placing it would copy those bytes into the device's memory in user space, where the
		// daemon's death can cut the copy anywhere and tear a 4 KiB unit. Only the kernel
		// copies into placed memory. (After a large WRITE the next header is read on its own,
		// readHeader, so a run of large WRITEs is placed.)
		return false, nil
	}
	done := 0
	var werr error // a piece's error: the reply's
	for done < n {
		pos, rest := off+int64(done), n-done
		// A piece needs the bytes up to the next unit boundary after pos (a whole unit from
		// a boundary), or the rest: a WRITE's head or tail alone is a piece too, which the
		// device places if it can (raid5d: if the stripe cache holds no newer data there).
		need := min(rest, int(u-pos%u))
		// All of the rest known to be here (known) costs no SIOCINQ; else awaitPiece asks
		// how much is, so that the piece is as long as can be.
		if p.avail = c.br.Buffered() + p.known; p.avail < rest && !c.awaitPiece(need) {
			break
		}
		take := rest
		if p.avail < rest { // to the last unit boundary that has arrived (at least need)
			take = int((pos+int64(p.avail))/u*u - pos)
		}
		vec, ph, ok := p.pw.PlaceWrite(pos, take, p.vec[:0])
		if !ok {
			break
		}
		// The WRITE's last piece takes what has arrived of the next request's header with
		// it (the buffered reader is empty: see above).
		got, rerr := c.readPlaced(vec, take, ph, take == rest)
		clear(vec)
		p.vec = vec[:0]
		err := p.pw.CommitPlaced(ph, got, done+got == n)
		if rerr != nil {
			return true, c.payloadError(h.Offset, done+got, n, rerr)
		}
		done += take
		if err != nil {
			werr = err // the WRITE has failed: the rest is dropped (writeRest)
			break
		}
	}
	if done == 0 {
		return false, nil
	}
	if done < n {
		return true, c.writeRest(h, done, werr)
	}
	// A request with no buffer, only for the reply (and the in-flight bound: the held replies
	// count, and are fewer than it).
	hr := *h
	hr.Length = 0
	req, aerr := c.acquire(&hr)
	if aerr != nil {
		return true, aerr // cannot happen without a buffer to map
	}
	req.length = h.Length
	errno := uint32(0)
	if werr != nil {
		errno = errnoOf(werr)
		c.log.Warn("nbd: request failed", "cmd", wire.CmdName(h.Type), "offset", h.Offset,
			"length", h.Length, "errno", errno, "err", werr)
	}
	c.serving.Add(1)
	c.encodeHeader(req, errno, -1, nil)
	c.deferReply(req)
	return true, nil
}

// writeRest hands the part of the WRITE h from done on, which was not placed, to a worker as an
// ordinary WRITE of that range under h's handle: its reply answers the whole WRITE. werr is
// the placed pieces' error: the rest is then read and dropped, and the reply carries werr.
func (c *conn) writeRest(h *protocol.TransmissionRequestHeader, done int, werr error) error {
	c.flushDeferred() // before waiting for the in-flight bound or a payload
	hr := *h
	hr.Offset += uint64(done)
	hr.Length -= uint32(done)
	if werr != nil { // refuse drops the payload
		return c.refuse(&hr, errnoOf(werr), werr)
	}
	req, err := c.acquire(&hr)
	if err != nil { // no memory for the buffer: the WRITE fails, the stream stays in sync
		return c.refuse(&hr, wire.EIO, err)
	}
	if err := c.readPayload(req); err != nil {
		c.release(req)
		return err
	}
	c.serving.Add(1)
	c.work <- req // never blocks: acquire keeps inflight <= cap(c.work)
	return nil
}

// readPlaced reads the n bytes of the placed piece ph into vec (slices adding up to n),
// straight from the socket with readv (the buffered reader holds none of them: writePlaced),
// within PayloadTimeout, telling a PlacedProgresser after each step (placedStep) how far it got.
// With next (the piece ends its WRITE), the readv that reads the payload's last bytes also
// reads as much of the next request's header as has arrived, into p.next (readHeader takes it
// from there): the header then costs no read of its own. It never waits for those bytes and
// never reads past them, into a payload that may be placed. It returns the payload bytes read
// and, if fewer than n, why.
func (c *conn) readPlaced(vec [][]byte, n int, ph any, next bool) (int, error) {
	p := &c.placed
	got, hgot := 0, 0 // payload bytes read; of the next header
	i, o := 0, 0      // the next payload byte goes to vec[i][o]
	advance := func(k int) {
		got += k
		for k > 0 {
			m := min(k, len(vec[i])-o)
			k -= m
			o += m
			if o == len(vec[i]) {
				i, o = i+1, 0
			}
		}
	}
	c.setReadDeadline(time.Now().Add(c.srv.payloadTimeout))
	defer c.setReadDeadline(time.Time{})
	for got < n {
		p.iov = p.iov[:0]
		step := 0
		for j := i; j < len(vec) && len(p.iov) < maxPlacedIov && (p.prog == nil || step < p.step); j++ {
			b := vec[j]
			if j == i {
				b = b[o:]
			}
			if p.prog != nil {
				b = b[:min(len(b), p.step-step)]
			}
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			p.iov = append(p.iov, v)
			step += len(b)
		}
		if next && got+step == n && len(p.iov) < maxPlacedIov { // the payload's last readv
			v := unix.Iovec{Base: &p.next[0]}
			v.SetLen(len(p.next))
			p.iov = append(p.iov, v)
		}
		p.rn, p.rerr = 0, nil
		err := p.rc.Read(p.readvFn)
		p.known = max(0, p.known-p.rn)
		if err == nil && p.rerr != nil {
			err = p.rerr
		}
		if err == nil && p.rn == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return got, err // the deadline, or the connection closed under the reader
		}
		k := min(p.rn, step)
		advance(k)
		hgot += p.rn - k
		if p.prog != nil && got < n {
			p.prog.PlacedReceived(ph, got)
		}
	}
	p.nextN = hgot
	return got, nil
}
