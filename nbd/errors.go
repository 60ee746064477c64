package nbd

import (
	"errors"
	"syscall"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// Configuration errors, returned by NewServer and LoadTLSConfig (wrapped with the offending
// detail).
var (
	// ErrNoExports is returned by NewServer when Options.Exports is empty.
	ErrNoExports = errors.New("nbd: no exports")
	// ErrInvalidExport is returned by NewServer for an export with a nil Device, a duplicate or
	// over-long name, block sizes the protocol does not allow, or AllowedClients on a server
	// that does not verify client certificates.
	ErrInvalidExport = errors.New("nbd: invalid export")
	// ErrInvalidOptions is returned by NewServer for negative limits in Options and for an
	// unknown TLSMode or one that needs a TLSConfig without it, and by ParseTLSMode for an
	// unknown mode name.
	ErrInvalidOptions = errors.New("nbd: invalid options")
	// ErrMemlockLimit is returned by NewServer with Options.MlockBuffers when RLIMIT_MEMLOCK
	// is below what one connection's buffers need and the process lacks CAP_IPC_LOCK.
	ErrMemlockLimit = errors.New("nbd: RLIMIT_MEMLOCK too low to lock request buffers")
	// ErrTLSConfig is returned by LoadTLSConfig when a certificate, key or CA file cannot be
	// loaded.
	ErrTLSConfig = errors.New("nbd: bad TLS configuration")
)

// Protocol violations: the server closes the connection and logs the error under the key "err".
// They never reach the caller of Serve; tests find them in the log records.
var (
	// ErrClientFlags: the client set a client flag the server did not advertise.
	ErrClientFlags = errors.New("nbd: unknown client flags")
	// ErrBadOptionMagic: an option did not start with IHAVEOPT.
	ErrBadOptionMagic = errors.New("nbd: bad option magic")
	// ErrOptionTooLong: an option announced more data than the server accepts (maxOptionLength).
	ErrOptionTooLong = errors.New("nbd: option data too long")
	// ErrUnknownExport: NBD_OPT_EXPORT_NAME named an export that does not exist; that option
	// cannot fail politely, so the protocol requires the session to end.
	ErrUnknownExport = errors.New("nbd: unknown export")
	// ErrBadRequestMagic: a request did not start with NBD_REQUEST_MAGIC; the stream is lost.
	ErrBadRequestMagic = errors.New("nbd: bad request magic")
	// ErrPayloadTooLarge: a WRITE announced a payload larger than the export's MaxBlock. The
	// server will not buffer it, and skipping it could be a denial of service, so it disconnects.
	ErrPayloadTooLarge = errors.New("nbd: write payload larger than the maximum block size")
)

// Refusals and limits: the server closes the connection and logs the error under the key
// "err", like the protocol violations above.
var (
	// ErrTLSRequired: under TLSRequire, NBD_OPT_EXPORT_NAME came before NBD_OPT_STARTTLS;
	// that option cannot fail politely, so the session ends.
	ErrTLSRequired = errors.New("nbd: TLS required")
	// ErrTLSHandshake: the TLS handshake after NBD_OPT_STARTTLS failed (no or a bad client
	// certificate, no common version or cipher, a plaintext client); too late to go back.
	ErrTLSHandshake = errors.New("nbd: TLS handshake failed")
	// ErrAccessDenied: NBD_OPT_EXPORT_NAME named an export whose allow-list does not admit
	// the client (Export.AllowedClients, Export.AllowedUIDs).
	ErrAccessDenied = errors.New("nbd: access to export denied")
	// ErrTooManyConnections: a connection arrived with Options.MaxConnections already served;
	// it is closed before the greeting.
	ErrTooManyConnections = errors.New("nbd: too many connections")
	// ErrHandshakeTimeout: the client did not finish the handshake within
	// Options.HandshakeTimeout.
	ErrHandshakeTimeout = errors.New("nbd: handshake timed out")
	// ErrIdleTimeout: the client sent no request for Options.IdleTimeout with none in flight.
	ErrIdleTimeout = errors.New("nbd: connection idle too long")
	// ErrReplyTimeout: writing one reply took longer than Options.ReplyTimeout; the client
	// stopped reading its socket.
	ErrReplyTimeout = errors.New("nbd: client stopped reading replies")
	// ErrPayloadTimeout: a WRITE's payload did not arrive within Options.PayloadTimeout.
	ErrPayloadTimeout = errors.New("nbd: write payload did not arrive in time")
)

// errClientAbort ends a handshake on NBD_OPT_ABORT; it is not a failure.
var errClientAbort = errors.New("nbd: client aborted the handshake")

// errnoOf maps a Device error onto the error values the protocol defines. An error in the chain
// with an Errno() uint32 method gives its own value; a syscall.Errno is mapped to the nearest
// value; anything else is EIO, and so is ENOMEM, ENOTSUP or a value the protocol does not define.
func errnoOf(err error) uint32 {
	var e interface{ Errno() uint32 }
	if errors.As(err, &e) {
		switch v := e.Errno(); v {
		case wire.EPERM, wire.EIO, wire.EINVAL, wire.ENOSPC, wire.EOVERFLOW, wire.ESHUTDOWN:
			return v
		}
		return wire.EIO // including ENOMEM and ENOTSUP, which the protocol asks servers to avoid
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		switch se {
		case syscall.EPERM, syscall.EACCES, syscall.EROFS:
			return wire.EPERM
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
			return wire.ENOSPC
		case syscall.EINVAL:
			return wire.EINVAL
		case syscall.EOVERFLOW:
			return wire.EOVERFLOW
		case syscall.ESHUTDOWN:
			return wire.ESHUTDOWN
		}
	}
	return wire.EIO
}
