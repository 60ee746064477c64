package client

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// Sentinel errors.
var (
	// ErrBadURI is returned by ParseURI and Dial for a URI they cannot use.
	ErrBadURI = errors.New("client: bad NBD URI")
	// ErrHandshake is returned by Dial and Handshake when the server breaks the handshake
	// protocol (wrong magic, a reply to another option, a malformed info reply).
	ErrHandshake = errors.New("client: handshake protocol error")
	// ErrDisconnected is wrapped by every request error once the connection is broken or closed.
	ErrDisconnected = errors.New("client: connection is closed")
	// ErrNotSent is wrapped, with ErrDisconnected, by the error of a request that failed
	// before any of it was written to the connection (it was already broken): the server
	// cannot have acted on it, so it may be sent again on another connection. A request that
	// fails with ErrDisconnected alone may or may not have reached the server.
	ErrNotSent = errors.New("client: request not sent")
	// ErrUnsupported is returned by a request the server did not advertise (FLUSH, FUA, TRIM,
	// WRITE_ZEROES).
	ErrUnsupported = errors.New("client: server does not support this request")
	// ErrReadOnly is returned by writes, trims and zeroing on a read-only export.
	ErrReadOnly = errors.New("client: export is read-only")
	// ErrTooLarge is returned by ReadAt and WriteAt for a buffer longer than the server's
	// maximum block size.
	ErrTooLarge = errors.New("client: request longer than the server's maximum block size")
	// ErrRange is returned by a request that reaches past the end of the export or has a
	// negative offset, before anything is sent.
	ErrRange = errors.New("client: request beyond end of export")
	// ErrTLSRequired is wrapped by the *OptionError Dial returns when a server that serves
	// only over TLS (NBD_REP_ERR_TLS_REQD) is dialled without it: use an nbds URI.
	ErrTLSRequired = errors.New("client: server requires TLS")
	// ErrTLSHandshake wraps a failed TLS handshake after NBD_OPT_STARTTLS (an untrusted or
	// misnamed server certificate, a client certificate the server refused, ...).
	ErrTLSHandshake = errors.New("client: TLS handshake failed")
)

// Error is a request the server answered with an error. Errno is the NBD error value (the
// protocol's subset of Linux errno values); errors.Is(err, syscall.EIO) and friends work.
type Error struct {
	Cmd    string // READ, WRITE, FLUSH, TRIM, WRITE_ZEROES
	Offset int64
	Length int64
	Errno  uint32
}

func (e *Error) Error() string {
	return fmt.Sprintf("client: %s of %d bytes at offset %d: server replied %s (errno %d)",
		e.Cmd, e.Length, e.Offset, wire.ErrnoName(e.Errno), e.Errno)
}

// Unwrap returns the errno as a syscall.Errno.
func (e *Error) Unwrap() error { return syscall.Errno(e.Errno) }

// OptionError is a handshake option the server refused: Reply is the NBD_REP_ERR_* value and
// Message the server's text, if any. Dial returns it (for example NBD_REP_ERR_UNKNOWN, 0x80000006,
// for an export name the server does not have).
type OptionError struct {
	Option  uint32
	Reply   uint32
	Message string
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("client: server refused option %s: %s%s", optName(e.Option), repName(e.Reply),
		func() string {
			if e.Message == "" {
				return ""
			}
			return ": " + e.Message
		}())
}

// Unwrap returns ErrTLSRequired for NBD_REP_ERR_TLS_REQD, so callers can say how to fix it.
func (e *OptionError) Unwrap() error {
	if e.Reply == wire.RepErrTLSReqd {
		return ErrTLSRequired
	}
	return nil
}

func optName(o uint32) string {
	switch o {
	case wire.OptExportName:
		return "NBD_OPT_EXPORT_NAME"
	case wire.OptGo:
		return "NBD_OPT_GO"
	case wire.OptAbort:
		return "NBD_OPT_ABORT"
	case wire.OptStartTLS:
		return "NBD_OPT_STARTTLS"
	}
	return fmt.Sprintf("%d", o)
}

func repName(r uint32) string {
	switch r {
	case wire.RepErrUnsup:
		return "NBD_REP_ERR_UNSUP"
	case wire.RepErrPolicy:
		return "NBD_REP_ERR_POLICY"
	case wire.RepErrInvalid:
		return "NBD_REP_ERR_INVALID"
	case wire.RepErrPlatform:
		return "NBD_REP_ERR_PLATFORM"
	case wire.RepErrTLSReqd:
		return "NBD_REP_ERR_TLS_REQD"
	case wire.RepErrUnknown:
		return "NBD_REP_ERR_UNKNOWN (no such export)"
	case wire.RepErrShutdown:
		return "NBD_REP_ERR_SHUTDOWN"
	case wire.RepErrBlockSizeReqd:
		return "NBD_REP_ERR_BLOCK_SIZE_REQD"
	case wire.RepErrTooBig:
		return "NBD_REP_ERR_TOO_BIG"
	}
	return fmt.Sprintf("reply %#x", r)
}
