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

// placedReader is the reader's state for placed writes: the device, the socket's raw
// descriptor, and scratch reused from WRITE to WRITE. The callbacks given to the raw
// descriptor are bound once (init), so a placed write allocates nothing.
type placedReader struct {
	pw  PlacedWriter // nil: no placed writes on this connection
	rc  syscall.RawConn
	vec [][]byte
	iov []unix.Iovec
	// Replies of placed writes held back to go out with the next ones (deferReply), and
	// whether the reader may read the next request before writing them: the bytes known to
	// have arrived after the last placed payload hold a whole request header.
	deferred []*request
	keep     bool
	avail    int   // arrived's count: bytes buffered and in the receive queue
	inq      int   // inqFn's answer
	rn       int   // readvFn's answer
	rerr     error // readvFn's error
	// inqFn and readvFn are the callbacks for rc.Control and rc.Read.
	inqFn   func(fd uintptr)
	readvFn func(fd uintptr) bool
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
	p.pw, p.rc = pw, rc
	p.inqFn = func(fd uintptr) {
		q, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if err != nil {
			q = 0
		}
		p.inq = q
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
// the socket's receive queue (SIOCINQ).
func (c *conn) arrived(n int) bool {
	p := &c.placed
	p.avail = c.br.Buffered()
	if p.avail >= n {
		return true
	}
	if err := p.rc.Control(p.inqFn); err != nil {
		return false
	}
	p.avail += p.inq
	return p.avail >= n
}

// maxDeferred bounds the placed writes whose replies wait for the next one (deferReply): a
// few, so that a deep queue of writes is answered in few writevs, and always fewer than the
// connection's in-flight bound, which counts them.
const maxDeferred = 16

// deferReply holds back the reply of the placed write req (its header encoded) when the next
// request has already arrived and fewer than maxDeferred replies are held: the reader is about
// to read it without waiting, and the replies go out together afterwards (flushDeferred).
// Otherwise it writes the held replies and req's now. On loopback a send costs about what a
// 48 KiB placed write's parity does.
func (c *conn) deferReply(req *request, ahead int) {
	p := &c.placed
	p.deferred = append(p.deferred, req)
	if ahead >= wire.RequestHeaderSize && len(p.deferred) < min(maxDeferred, c.srv.maxInFlightReqs-1) {
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
// straight into the device (PlacedWriter), if the payload has all arrived and the device takes
// it, and reports whether it did; the reply goes out as a worker's would. An error is a failed
// read of the payload (the connection ends; the device has made the range consistent).
func (c *conn) writePlaced(h *protocol.TransmissionRequestHeader) (bool, error) {
	n := int(h.Length)
	if !c.arrived(n) {
		return false, nil
	}
	p := &c.placed
	ahead := p.avail - n // bytes of the next requests already here
	vec, ph, ok := p.pw.PlaceWrite(int64(h.Offset), n, p.vec[:0])
	if !ok {
		return false, nil
	}
	got, rerr := c.readPlaced(vec, n)
	clear(vec)
	p.vec = vec[:0]
	err := p.pw.CommitPlaced(ph, got)
	if rerr != nil {
		return true, c.payloadError(h.Offset, got, n, rerr)
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
	if err != nil {
		errno = errnoOf(err)
		c.log.Warn("nbd: request failed", "cmd", wire.CmdName(h.Type), "offset", h.Offset,
			"length", h.Length, "errno", errno, "err", err)
	}
	c.serving.Add(1)
	c.encodeHeader(req, errno, -1, nil)
	c.deferReply(req, ahead)
	return true, nil
}

// readPlaced reads the n bytes of a payload into vec (slices adding up to n): first what the
// buffered reader holds, then straight from the socket with readv, within PayloadTimeout. It
// returns the bytes read and, if fewer than n, why.
func (c *conn) readPlaced(vec [][]byte, n int) (int, error) {
	got := 0
	i, o := 0, 0 // the next byte goes to vec[i][o]
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
	for got < n && c.br.Buffered() > 0 {
		k, _ := c.br.Read(vec[i][o:]) // a copy from the buffer: cannot fail
		advance(k)
	}
	if got == n {
		return got, nil
	}
	c.setReadDeadline(time.Now().Add(c.srv.payloadTimeout))
	defer c.setReadDeadline(time.Time{})
	p := &c.placed
	for got < n {
		p.iov = p.iov[:0]
		for j := i; j < len(vec) && len(p.iov) < maxPlacedIov; j++ {
			b := vec[j]
			if j == i {
				b = b[o:]
			}
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			p.iov = append(p.iov, v)
		}
		p.rn, p.rerr = 0, nil
		if err := p.rc.Read(p.readvFn); err != nil {
			return got, err // the deadline, or the connection closed under the reader
		}
		if p.rerr != nil {
			return got, p.rerr
		}
		if p.rn == 0 {
			return got, io.ErrUnexpectedEOF
		}
		advance(p.rn)
	}
	return got, nil
}
