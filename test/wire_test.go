package test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// A hand-written NBD client, frame by frame, for traffic no real client sends. Only the simple
// reply format (no structured replies) and the fixed-newstyle handshake.

const (
	nbdMagic          = 0x4e42444d41474943 // "NBDMAGIC"
	nbdIHaveOpt       = 0x49484156454f5054 // "IHAVEOPT"
	nbdOptReplyMagic  = 0x0003e889045565a9
	nbdRequestMagic   = 0x25609513
	nbdSimpleReplyMag = 0x67446698

	nbdFlagFixedNewstyle = 1 << 0 // handshake flags, and the client's echo of them
	nbdFlagNoZeroes      = 1 << 1

	nbdOptAbort = 2
	nbdOptGo    = 7

	nbdRepAck        = 1
	nbdRepInfo       = 3
	nbdRepErrUnsup   = 1<<31 | 1
	nbdRepErrUnknown = 1<<31 | 6

	nbdInfoExport    = 0
	nbdInfoBlockSize = 3

	nbdCmdRead  = 0
	nbdCmdWrite = 1
	nbdCmdDisc  = 2
	nbdCmdFlush = 3

	nbdCmdFlagFUA = 1 << 0

	nbdTransFlagReadOnly = 1 << 1
)

// wireTimeout bounds every exchange, so a server that neither answers nor closes fails a test
// instead of hanging it.
const wireTimeout = 15 * time.Second

// wireClient is one NBD connection driven by hand. Not safe for concurrent use.
type wireClient struct {
	conn   net.Conn
	size   uint64 // export size, from OPT_GO
	flags  uint16 // transmission flags, from OPT_GO
	handle uint64 // last handle used

	// Block size constraints from OPT_GO; all 0 when the server sent none.
	minBlock, preferredBlock, maxBlock uint32
}

// wireDial connects to the unix socket and completes the greeting (fixed newstyle, with
// NO_ZEROES when offered), leaving the connection in option haggling.
func wireDial(sock string) (*wireClient, error) {
	conn, err := net.DialTimeout("unix", sock, wireTimeout)
	if err != nil {
		return nil, err
	}
	return wireGreet(conn)
}

// wireGreet completes the greeting on a new connection to a server, as wireDial does; conn is
// closed on an error.
func wireGreet(conn net.Conn) (*wireClient, error) {
	c := &wireClient{conn: conn}
	conn.SetDeadline(time.Now().Add(wireTimeout))
	var hello [18]byte
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		conn.Close()
		return nil, fmt.Errorf("reading greeting: %w", err)
	}
	magic, opt := binary.BigEndian.Uint64(hello[0:]), binary.BigEndian.Uint64(hello[8:])
	flags := binary.BigEndian.Uint16(hello[16:])
	if magic != nbdMagic || opt != nbdIHaveOpt || flags&nbdFlagFixedNewstyle == 0 {
		conn.Close()
		return nil, fmt.Errorf("greeting %x %x flags %#x: not fixed newstyle", magic, opt, flags)
	}
	if err := binary.Write(conn, binary.BigEndian, uint32(flags&(nbdFlagFixedNewstyle|nbdFlagNoZeroes))); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// wireConnect is wireDial followed by OPT_GO for the default export.
func wireConnect(sock string) (*wireClient, error) {
	c, err := wireDial(sock)
	if err != nil {
		return nil, err
	}
	if err := c.optGo(""); err != nil {
		c.conn.Close()
		return nil, err
	}
	return c, nil
}

func (c *wireClient) Close() error { return c.conn.Close() }

// sendOption sends one option request.
func (c *wireClient) sendOption(opt uint32, data []byte) error {
	c.conn.SetDeadline(time.Now().Add(wireTimeout))
	b := binary.BigEndian.AppendUint64(nil, nbdIHaveOpt)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	_, err := c.conn.Write(append(b, data...))
	return err
}

// optionReply reads one option reply and checks its magic.
func (c *wireClient) optionReply() (opt, typ uint32, data []byte, err error) {
	c.conn.SetDeadline(time.Now().Add(wireTimeout))
	var h [20]byte
	if _, err := io.ReadFull(c.conn, h[:]); err != nil {
		return 0, 0, nil, fmt.Errorf("reading option reply: %w", err)
	}
	if m := binary.BigEndian.Uint64(h[0:]); m != nbdOptReplyMagic {
		return 0, 0, nil, fmt.Errorf("option reply magic %#x", m)
	}
	opt, typ = binary.BigEndian.Uint32(h[8:]), binary.BigEndian.Uint32(h[12:])
	n := binary.BigEndian.Uint32(h[16:])
	if n > 1<<20 {
		return 0, 0, nil, fmt.Errorf("option reply of %d bytes", n)
	}
	data = make([]byte, n)
	if _, err := io.ReadFull(c.conn, data); err != nil {
		return 0, 0, nil, fmt.Errorf("reading option reply data: %w", err)
	}
	return opt, typ, data, nil
}

// errOptionRefused is what optGo returns when the server answers with an error reply;
// it is wrapped in an *optionError that carries the reply type.
var errOptionRefused = errors.New("option refused")

type optionError struct{ typ uint32 }

func (e *optionError) Error() string { return fmt.Sprintf("option refused: reply type %#x", e.typ) }
func (e *optionError) Unwrap() error { return errOptionRefused }

// optGo sends NBD_OPT_GO for name, asking for block sizes, and reads replies up to the ACK,
// recording size, flags and block sizes.
func (c *wireClient) optGo(name string) error {
	data := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	data = append(data, name...)
	data = binary.BigEndian.AppendUint16(data, 1)
	data = binary.BigEndian.AppendUint16(data, nbdInfoBlockSize)
	if err := c.sendOption(nbdOptGo, data); err != nil {
		return err
	}
	sawExport := false
	for {
		opt, typ, d, err := c.optionReply()
		if err != nil {
			return err
		}
		if opt != nbdOptGo {
			return fmt.Errorf("reply to option %d, want %d (OPT_GO)", opt, nbdOptGo)
		}
		switch {
		case typ == nbdRepAck:
			if !sawExport {
				return errors.New("OPT_GO acknowledged without NBD_INFO_EXPORT")
			}
			return nil
		case typ == nbdRepInfo && len(d) >= 2 && binary.BigEndian.Uint16(d) == nbdInfoExport:
			if len(d) != 12 {
				return fmt.Errorf("NBD_INFO_EXPORT of %d bytes", len(d))
			}
			c.size, c.flags = binary.BigEndian.Uint64(d[2:]), binary.BigEndian.Uint16(d[10:])
			sawExport = true
		case typ == nbdRepInfo && len(d) >= 2 && binary.BigEndian.Uint16(d) == nbdInfoBlockSize:
			if len(d) != 14 {
				return fmt.Errorf("NBD_INFO_BLOCK_SIZE of %d bytes", len(d))
			}
			c.minBlock = binary.BigEndian.Uint32(d[2:])
			c.preferredBlock = binary.BigEndian.Uint32(d[6:])
			c.maxBlock = binary.BigEndian.Uint32(d[10:])
		case typ == nbdRepInfo:
			// other information: ignore
		case typ&(1<<31) != 0:
			return &optionError{typ: typ}
		default:
			return fmt.Errorf("unexpected OPT_GO reply type %#x", typ)
		}
	}
}

// send writes one request header and its payload (if any).
func (c *wireClient) send(typ, flags uint16, off uint64, length uint32, payload []byte) (handle uint64, err error) {
	c.handle++
	c.conn.SetDeadline(time.Now().Add(wireTimeout))
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 28+len(payload)), nbdRequestMagic)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, c.handle)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, length)
	_, err = c.conn.Write(append(b, payload...))
	return c.handle, err
}

// reply reads one simple reply header and, when it reports success and dataLen > 0, that many
// bytes of read data.
func (c *wireClient) reply(handle uint64, dataLen uint32) (errno uint32, data []byte, err error) {
	c.conn.SetDeadline(time.Now().Add(wireTimeout))
	var h [16]byte
	if _, err := io.ReadFull(c.conn, h[:]); err != nil {
		return 0, nil, fmt.Errorf("reading reply: %w", err)
	}
	if m := binary.BigEndian.Uint32(h[0:]); m != nbdSimpleReplyMag {
		return 0, nil, fmt.Errorf("reply magic %#x", m)
	}
	errno = binary.BigEndian.Uint32(h[4:])
	if got := binary.BigEndian.Uint64(h[8:]); got != handle {
		return 0, nil, fmt.Errorf("reply for handle %d, want %d", got, handle)
	}
	if errno != 0 || dataLen == 0 {
		return errno, nil, nil
	}
	data = make([]byte, dataLen)
	if _, err := io.ReadFull(c.conn, data); err != nil {
		return 0, nil, fmt.Errorf("reading %d bytes of read data: %w", dataLen, err)
	}
	return 0, data, nil
}

// do sends one request and waits for its reply; length is the request's length field, and
// read data is expected only for NBD_CMD_READ.
func (c *wireClient) do(typ, flags uint16, off uint64, length uint32, payload []byte) (errno uint32, data []byte, err error) {
	h, err := c.send(typ, flags, off, length, payload)
	if err != nil {
		return 0, nil, err
	}
	dataLen := uint32(0)
	if typ == nbdCmdRead {
		dataLen = length
	}
	return c.reply(h, dataLen)
}

// errNBD is returned (wrapped in an *nbdErrno) for a request the server answered with an error.
var errNBD = errors.New("nbd request failed")

type nbdErrno uint32

func (e nbdErrno) Error() string {
	return fmt.Sprintf("nbd errno %d (%v)", uint32(e), syscall.Errno(e))
}
func (e nbdErrno) Unwrap() error { return errNBD }

// readAt reads n bytes at off; a server error comes back as an nbdErrno.
func (c *wireClient) readAt(off uint64, n uint32) ([]byte, error) {
	errno, data, err := c.do(nbdCmdRead, 0, off, n, nil)
	if err == nil && errno != 0 {
		err = nbdErrno(errno)
	}
	return data, err
}

// writeAt writes p at off, with FUA when fua is set.
func (c *wireClient) writeAt(p []byte, off uint64, fua bool) error {
	var flags uint16
	if fua {
		flags = nbdCmdFlagFUA
	}
	errno, _, err := c.do(nbdCmdWrite, flags, off, uint32(len(p)), p)
	if err == nil && errno != 0 {
		err = nbdErrno(errno)
	}
	return err
}

// flush sends NBD_CMD_FLUSH.
func (c *wireClient) flush() error {
	errno, _, err := c.do(nbdCmdFlush, 0, 0, 0, nil)
	if err == nil && errno != 0 {
		err = nbdErrno(errno)
	}
	return err
}

// abort sends NBD_OPT_ABORT during option haggling, waits for the server's answer (an ACK,
// or the connection closing) and closes the connection.
func (c *wireClient) abort() error {
	defer c.conn.Close()
	if err := c.sendOption(nbdOptAbort, nil); err != nil {
		return err
	}
	opt, typ, _, err := c.optionReply()
	if errors.Is(err, io.EOF) {
		return nil // the server may close without a reply
	}
	if err == nil && (opt != nbdOptAbort || typ != nbdRepAck) {
		err = fmt.Errorf("reply to NBD_OPT_ABORT: option %d type %#x", opt, typ)
	}
	return err
}

// disconnect sends NBD_CMD_DISC (which has no reply) and closes the connection.
func (c *wireClient) disconnect() error {
	_, err := c.send(nbdCmdDisc, 0, 0, 0, nil)
	return errors.Join(err, c.conn.Close())
}

// waitClosed reads until the server closes the connection. It returns nil on a clean close
// (EOF or reset) within the deadline, and the bytes the server sent before closing.
func (c *wireClient) waitClosed() ([]byte, error) {
	c.conn.SetDeadline(time.Now().Add(wireTimeout))
	got, err := io.ReadAll(c.conn)
	if err == nil || errors.Is(err, syscall.ECONNRESET) {
		return got, nil
	}
	return got, fmt.Errorf("connection not closed by the server: %w", err)
}
