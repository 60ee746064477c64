// Package client is an NBD client: the fixed-newstyle handshake and the transmission phase,
// with many requests in flight on one connection.
//
//	c, err := client.Dial(ctx, "nbd+unix:///array?socket=/run/raid5d.sock", client.Options{})
//	...
//	defer c.Close()
//	_, err = c.WriteAtFUA(buf, 0) // durable when it returns
//
// # Protocol
//
// The wire format is doc/proto.md of the NBD reference implementation (its constants and
// headers are the server's, nbd/internal/wire). The handshake asks for
// NBD_FLAG_C_FIXED_NEWSTYLE and, when the server offers it, NBD_FLAG_C_NO_ZEROES; for an nbds
// URI (or Options.TLSConfig) it sends NBD_OPT_STARTTLS and runs the TLS handshake (crypto/tls,
// TLS 1.2 or later; LoadTLSConfig reads the CA, client certificate and key), then it sends
// NBD_OPT_GO with NBD_INFO_BLOCK_SIZE and NBD_INFO_NAME requests (the name the server reports
// is Conn.ExportName), and falls back to NBD_OPT_EXPORT_NAME when
// the server answers NBD_REP_ERR_UNSUP (or speaks plain, unfixed newstyle). Transmission uses
// simple replies: READ, WRITE (optionally with NBD_CMD_FLAG_FUA), FLUSH, TRIM, WRITE_ZEROES
// (optionally NO_HOLE) and DISC. A request the server did not advertise (FLUSH without
// NBD_FLAG_SEND_FLUSH, a write to a read-only export, ...) fails with ErrUnsupported or
// ErrReadOnly before anything is sent. A server that serves only over TLS refuses a plaintext
// client with NBD_REP_ERR_TLS_REQD: Dial's error then wraps ErrTLSRequired.
//
// # Concurrency
//
// A Conn is safe for concurrent use: every method may be called from many goroutines, and each
// call is one request on the wire, so N goroutines keep N requests in flight (up to
// Options.MaxInFlight; further calls wait for a slot). Requests are queued and written in
// batches: a caller that finds nobody writing writes everything queued, one writev per batch,
// until the queue is empty (yielding the processor once first when few are queued, so that
// the callers about to send join the batch), so under load many requests share a system call. One reader
// goroutine reads the replies in whatever order the server sends them, matches each to its
// request by cookie, reads a READ's payload into the caller's buffer, and wakes the caller.
// A payload of 16 KiB or more is read from the socket straight into that buffer, with readv(2)
// taking the next reply's header in the same system call (replies.go; on TLS connections
// through a buffer and a copy); smaller replies come many at a time through a 64 KiB buffer.
// ReadvAt and WritevAt make one request of several buffers (one writev of the header and
// every buffer; the payload read with one readv into all of them and the next reply's header,
// while what is left of it is 16 KiB or more). No request allocates.
//
// A failed request (the server replied with an error) returns an *Error carrying the NBD
// errno; the connection goes on. A broken connection (I/O error, a reply that breaks the
// protocol) fails every request in flight and every later one with an error wrapping
// ErrDisconnected; a request refused before any of it was written wraps ErrNotSent too (it
// may be sent again elsewhere). Done and Err tell whether the connection is broken.
//
// # Buffers
//
// ReadAt's p is written by the reader goroutine until ReadAt returns; WriteAt's p is only read,
// and not kept after the call returns.
package client

// BUG(client): No structured replies, block status or extended headers. TLS is by certificate
// only: no pre-shared keys (libnbd's tls-psk-file), and no tls-certificates URI parameters.
//
// BUG(client): A READ or WRITE longer than the server's maximum block size fails with
// ErrTooLarge instead of being split.
//
// BUG(client): Requests are not cancellable: a call waits for its reply (or the connection to
// break); use SetDeadline on a dialled net.Conn, or Close, to give up.
