package client

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// directMin is the READ payload from which the reply reader reads the payload from the socket
// straight into the caller's buffer rather than through its own buffer and a copy (a 1 MiB
// array read over remote members spent 12-15% of raid5d's CPU in that copy). Below it, one
// read into the buffer takes many small replies at once.
const directMin = 16 << 10

// replyBufSize is the reply reader's buffer: many small replies per read(2).
const replyBufSize = 64 << 10

// replyReader reads the stream of replies: headers and small payloads through buf, and
// payloads of directMin and more with readv(2) into the caller's buffer and, in the same
// system call, buf (what follows the payload), so that the direct path costs no more system
// calls than the buffered one. After a large payload (direct) it reads no further ahead than
// the next reply's header, which would pull the next payload into buf to be copied: a
// stream of large READ replies costs one readv each (the payload and the next header), with
// no copy. Without a file descriptor (a TLS connection) everything goes through a
// bufio.Reader. Only the reply reader goroutine uses it.
type replyReader struct {
	br   *bufio.Reader   // TLS (no descriptor): every read goes through it
	rc   syscall.RawConn // else: the socket, read with read(2) and readv(2)
	buf  []byte          // buf[r:w] is read and not yet consumed
	r, w int
	// ahead is how far a read into buf may go past what it needs: all of buf, or a reply
	// header after a large payload (direct).
	ahead int

	// The read in progress, for readFn (rawRead as a method value made once: no allocation
	// per call): into iov, or, when vec is not empty, the iovecs vec (readPayload's readv of
	// several buffers).
	iov    [2][]byte
	vec    []unix.Iovec
	n      int
	err    error
	readFn func(fd uintptr) bool
	reads  *atomic.Uint64 // counts every read(2) and readv(2)
}

// maxVec bounds the iovecs of one readv: a payload of more buffers is read in several.
const maxVec = 64

// newReplyReader reads replies from nc, starting with what br (the handshake's reader of
// nc) has buffered.
func newReplyReader(nc net.Conn, br *bufio.Reader, reads *atomic.Uint64) *replyReader {
	sc, ok := nc.(syscall.Conn)
	var rc syscall.RawConn
	if ok {
		rc, _ = sc.SyscallConn()
	}
	if rc == nil {
		return &replyReader{br: br}
	}
	rr := &replyReader{rc: rc, buf: make([]byte, replyBufSize), ahead: replyBufSize, vec: make([]unix.Iovec, 0, maxVec), reads: reads}
	rr.w, _ = br.Read(rr.buf[:br.Buffered()]) // only the buffered bytes: no read(2), no error
	rr.readFn = rr.rawRead
	return rr
}

// readPayload reads a READ's payload into p, or into each of bufs in turn. While the rest of
// a payload of several buffers is directMin or more, it is read from the socket with one
// readv(2) into all of them (up to maxVec) and, as readFull does for one buffer, the next
// reply's header: one system call where a member's run of chunks took one per chunk.
func (rr *replyReader) readPayload(p []byte, bufs [][]byte) error {
	if bufs == nil {
		return rr.readFull(p)
	}
	rest := 0
	for _, b := range bufs {
		rest += len(b)
	}
	i, off := 0, 0 // bufs[i][off:] is where the next byte goes
	for rr.br == nil && rest >= directMin {
		for off == len(bufs[i]) { // rest > 0: a buffer with room follows
			i, off = i+1, 0
		}
		var n int
		if rr.r < rr.w { // what buf holds first
			n = copy(bufs[i][off:], rr.buf[rr.r:rr.w])
			rr.r += n
			if rr.r == rr.w {
				rr.r, rr.w = 0, 0
			}
		} else {
			if err := rr.readv(bufs[i:], off, rest); err != nil {
				return err
			}
			n = min(rr.n, rest)
			rr.w = rr.n - n // what came after the payload: the next header, into buf
		}
		rest -= n
		for n > 0 {
			k := min(n, len(bufs[i])-off)
			off, n = off+k, n-k
			if off == len(bufs[i]) && n > 0 {
				i, off = i+1, 0
			}
		}
	}
	for ; i < len(bufs); i, off = i+1, 0 { // a small rest (or TLS): through buf
		if err := rr.readFull(bufs[i][off:]); err != nil {
			return err
		}
	}
	return nil
}

// readv reads from the socket into bufs[0][off:], bufs[1:] (up to maxVec buffers) and, when
// they are all of the rest, into buf as far as the next reply's header; buf is empty. The
// count is left in rr.n.
func (rr *replyReader) readv(bufs [][]byte, off, rest int) error {
	vec := rr.vec[:0]
	for j, b := range bufs {
		if j == 0 {
			b = b[off:]
		}
		if len(vec) == maxVec-1 {
			break
		}
		if rest -= len(b); len(b) > 0 {
			vec = appendIovec(vec, b)
		}
	}
	if rest == 0 {
		vec = appendIovec(vec, rr.buf[:min(rr.ahead, wire.ReplyHeaderSize)])
	}
	rr.vec = vec
	rr.n, rr.err = 0, nil
	err := rr.rc.Read(rr.readFn)
	clear(rr.vec) // keep no caller's buffer
	rr.vec = rr.vec[:0]
	return rr.readErr(err)
}

func appendIovec(vec []unix.Iovec, b []byte) []unix.Iovec {
	v := unix.Iovec{Base: &b[0]}
	v.SetLen(len(b))
	return append(vec, v)
}

// readFull reads len(p) bytes into p.
func (rr *replyReader) readFull(p []byte) error {
	if rr.br != nil {
		_, err := io.ReadFull(rr.br, p)
		return err
	}
	n := copy(p, rr.buf[rr.r:rr.w])
	rr.r += n
	p = p[n:]
	if rr.r == rr.w {
		rr.r, rr.w = 0, 0
	}
	// The buffer is empty from here on.
	for len(p) > 0 {
		if len(p) < directMin {
			if err := rr.sys(rr.buf[:min(max(len(p), rr.ahead), len(rr.buf))], nil); err != nil {
				return err
			}
			rr.w = rr.n
			n := copy(p, rr.buf[:rr.w])
			rr.r = n
			p = p[n:]
			if rr.r == rr.w {
				rr.r, rr.w = 0, 0
			}
			continue
		}
		// The payload and what follows it (no further than a header: the next payload is
		// probably large too) in one readv.
		if err := rr.sys(p, rr.buf[:min(rr.ahead, wire.ReplyHeaderSize)]); err != nil {
			return err
		}
		if rr.n <= len(p) {
			p = p[rr.n:]
			continue
		}
		rr.w = rr.n - len(p)
		p = nil
	}
	return nil
}

// direct says whether the payload just read was large (directMin): reads into the buffer then
// stop at the next reply's header, else they take what the socket holds.
func (rr *replyReader) direct(large bool) {
	rr.ahead = replyBufSize
	if large {
		rr.ahead = wire.ReplyHeaderSize
	}
}

// sys reads from the socket into a, then b (if not nil: one readv), until it has read
// something, and leaves the count in rr.n; the end of the stream is io.ErrUnexpectedEOF.
func (rr *replyReader) sys(a, b []byte) error {
	rr.iov[0], rr.iov[1] = a, b
	rr.n, rr.err = 0, nil
	err := rr.rc.Read(rr.readFn)
	rr.iov[0], rr.iov[1] = nil, nil // keep no caller's buffer
	return rr.readErr(err)
}

// readErr is the outcome of a read through rawRead that returned err: its error or the
// system call's, and io.ErrUnexpectedEOF if it read nothing (the end of the stream).
func (rr *replyReader) readErr(err error) error {
	switch {
	case err != nil:
		return err
	case rr.err != nil:
		return rr.err
	case rr.n == 0:
		return io.ErrUnexpectedEOF
	}
	return nil
}

// rawRead is sys's and readv's RawConn.Read function: readv(2) into vec when it is not empty,
// else read(2) into iov[0], or readv(2) into both when iov[1] is set; false (wait for the
// socket to be readable) on EAGAIN, again on EINTR.
func (rr *replyReader) rawRead(fd uintptr) bool {
	for {
		rr.reads.Add(1)
		var n int
		var err error
		if len(rr.vec) > 0 {
			r, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&rr.vec[0])), uintptr(len(rr.vec)))
			n, err = int(r), nil
			if e != 0 {
				n, err = -1, e
			}
		} else if rr.iov[1] == nil {
			n, err = unix.Read(int(fd), rr.iov[0])
		} else {
			n, err = unix.Readv(int(fd), rr.iov[:])
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return false
		}
		rr.n, rr.err = max(n, 0), err
		return true
	}
}
