package nbd

import (
	"fmt"
	"io"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// readHeader reads the next request header into hb and decodes it. A placed WRITE's last
// read may have taken the header already (placedReader.next). After a large WRITE (direct)
// it reads straight from the connection when the buffered reader is empty, so that the
// buffered reader does not fetch the next payload ahead into its buffer (directReadMin).
func (c *conn) readHeader(hb *[wire.RequestHeaderSize]byte, direct bool) (protocol.TransmissionRequestHeader, error) {
	var err error
	p := &c.placed
	k := copy(hb[:], p.next[:p.nextN])
	p.nextN = 0
	if k < len(hb) {
		p.forget() // the socket is read: what was known of its queue is not kept up
		if direct && c.br.Buffered() == 0 {
			_, err = io.ReadFull(c.nc, hb[k:])
		} else {
			_, err = io.ReadFull(c.br, hb[k:])
		}
	}
	if err != nil {
		return protocol.TransmissionRequestHeader{}, err
	}
	if c.srv.idleTimeout > 0 {
		c.lastActive.Store(time.Now().UnixNano())
	}
	return wire.DecodeRequest(hb), nil
}

// refuse answers a request the reader will not serve with errno, from the reader, after
// reading past a WRITE's payload to stay in sync, and logs it: why is the error behind the
// refusal (a buffer that could not be mapped), or nil for a request checkRequest refused. It
// returns an error only if the payload could not be read.
func (c *conn) refuse(h *protocol.TransmissionRequestHeader, errno uint32, why error) error {
	if h.Type == wire.CmdWrite {
		// Stay in sync: the payload follows whatever we think of the request.
		if err := c.discardPayload(h); err != nil {
			return err
		}
	}
	if why == nil {
		c.log.Debug("nbd: request refused", "cmd", wire.CmdName(h.Type), "flags", h.CommandFlags,
			"offset", h.Offset, "length", h.Length, "errno", errno)
	} else {
		c.log.Warn("nbd: request refused", "cmd", wire.CmdName(h.Type), "offset", h.Offset,
			"length", h.Length, "errno", errno, "err", why)
	}
	c.replyFromReader(h, errno)
	return nil
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
// with a *payloadTimeoutError. It ends the payload's use of the budget's lane (endPayload)
// either way; on error the caller releases req.
func (c *conn) readPayload(req *request) error {
	c.placed.forget()
	b := req.buf
	p := b.mem[:req.length]
	n := 0
	var deadline time.Time // zero until the first read from the socket sets it
	defer func() {
		if !deadline.IsZero() {
			c.setReadDeadline(time.Time{})
		}
		c.srv.mem.endPayload(c.hold)
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
	c.placed.forget()
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
	if h.RequestMagic != wire.MagicRequest {
		return 0, fmt.Errorf("%w: %#x", ErrBadRequestMagic, h.RequestMagic)
	}
	if h.Type == wire.CmdWrite && h.Length > e.MaxBlock {
		return 0, fmt.Errorf("%w: %d bytes at offset %d (MaxBlock %d)",
			ErrPayloadTooLarge, h.Length, h.Offset, e.MaxBlock)
	}
	return checkCommand(h, sess), nil
}

// checkCommand returns the errno for a request with a good magic and a payload it can read.
func checkCommand(h *protocol.TransmissionRequestHeader, sess *session) uint32 {
	e := sess.export
	allowed := uint16(0)
	if sess.flags&wire.FlagSendFUA != 0 {
		allowed |= wire.CmdFlagFUA // valid on every command once advertised
	}
	write := false
	switch h.Type {
	case wire.CmdRead:
		if sess.structured {
			allowed |= wire.CmdFlagDF // every READ reply is one chunk anyway
		}
	case wire.CmdCache:
	case wire.CmdBlockStatus:
		if !sess.metaAlloc || h.Length == 0 {
			return wire.EINVAL // no context selected; or nothing to describe
		}
		allowed |= wire.CmdFlagReqOne
	case wire.CmdDisc:
		return 0 // flags, offset and length are ignored: the client is leaving
	case wire.CmdWrite, wire.CmdTrim:
		write = true
	case wire.CmdWriteZeroes:
		write = true
		allowed |= wire.CmdFlagNoHole
	case wire.CmdFlush:
		if h.CommandFlags&^allowed != 0 {
			return wire.EINVAL
		}
		return 0 // offset and length are reserved; ignored
	default:
		return wire.EINVAL // unknown command
	}
	if h.CommandFlags&^allowed != 0 {
		return wire.EINVAL
	}
	if write && e.ReadOnly {
		return wire.EPERM
	}
	if h.Offset > sess.size || uint64(h.Length) > sess.size-h.Offset {
		if h.Type == wire.CmdWrite || h.Type == wire.CmdWriteZeroes {
			return wire.ENOSPC
		}
		return wire.EINVAL
	}
	// The length of a BLOCK_STATUS is a hint (clients ask for "the rest", rounded to
	// nothing in particular), so only its offset must be aligned.
	mb := uint64(e.MinBlock)
	if h.Offset%mb != 0 || (uint64(h.Length)%mb != 0 && h.Offset+uint64(h.Length) != sess.size &&
		h.Type != wire.CmdBlockStatus) {
		return wire.EINVAL
	}
	if h.Type == wire.CmdRead && h.Length > e.MaxBlock {
		// A simple reply cannot carry more than the maximum payload: the request fails.
		return wire.EINVAL
	}
	return 0
}
