// Package nbd is raid5d's Network Block Device server: the fixed-newstyle handshake, option
// haggling and the transmission phase, serving any Device. It knows nothing of RAID.
//
// Create a Server with NewServer and run Serve on a listener (TCP or unix socket):
//
//	srv, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "array", Device: dev}}})
//	...
//	err = srv.Serve(ctx, ln) // until ctx is done; drains in-flight requests first
//
// # Protocol
//
// The wire format is doc/proto.md of the NBD reference implementation; constants and the
// header structs come from go-nbd's protocol package, with the missing ones in types.go. The
// files follow the protocol's phases: server.go (listeners, connections), handshake.go
// (greeting and options), transmission.go (requests and replies).
//
// Handshake: the server offers NBD_FLAG_FIXED_NEWSTYLE and NBD_FLAG_NO_ZEROES and drops a client
// that sets any other client flag. It answers NBD_OPT_EXPORT_NAME (size, flags, and 124 zero
// bytes unless the client chose NO_ZEROES), NBD_OPT_INFO and NBD_OPT_GO (NBD_INFO_EXPORT;
// NBD_INFO_NAME and NBD_INFO_DESCRIPTION when asked; NBD_INFO_BLOCK_SIZE always, since the
// server enforces it), NBD_OPT_LIST and NBD_OPT_ABORT (ACK, then close). Every other option,
// including STARTTLS, STRUCTURED_REPLY and the metadata-context options, gets NBD_REP_ERR_UNSUP
// with its data consumed, so the client may carry on. An unknown name gets NBD_REP_ERR_UNKNOWN,
// except after NBD_OPT_EXPORT_NAME, which cannot fail politely: the connection closes. So does
// an option announcing more than 64 KiB of data. The empty name is the first export.
//
// Transmission: the flags say what the Device interface offers: HAS_FLAGS, SEND_FLUSH,
// SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES and CAN_MULTI_CONN (Device.Flush makes every completed
// write durable, whichever connection made it); a read-only export has READ_ONLY instead of
// FUA, TRIM and WRITE_ZEROES. READ, WRITE (FUA via FUAWriter when the Device has it, else
// WriteAt then Flush; without FUA via PinnedWriter when Export.StablePages is on), FLUSH, TRIM, WRITE_ZEROES (NO_HOLE and FUA honoured), CACHE (checked,
// then ignored) and DISC are served. A request the server refuses gets a reply with an error
// and the connection goes on: EINVAL for an unknown command or flag, a READ, TRIM or CACHE past
// the end, a misaligned offset or length (Export.MinBlock), or a READ longer than MaxBlock;
// ENOSPC for a WRITE or WRITE_ZEROES past the end; EPERM for writes to a read-only export. A
// failed Device call is answered with the error's own value (an Errno() uint32 method, see
// Device) or the nearest one for a syscall.Errno, else EIO. Only a broken stream closes the
// connection, with a log line saying why: a bad request magic (ErrBadRequestMagic), a WRITE
// payload above MaxBlock (ErrPayloadTooLarge: the server will neither buffer nor skip it), or
// an I/O error on the socket.
//
// # Concurrency and buffer ownership
//
// Serve runs one goroutine per connection and tracks them with a WaitGroup. Within a
// connection, that goroutine reads and decodes requests and hands each to a worker; workers
// (started on demand, never more than the requests in flight) call the Device concurrently and
// write replies as they complete, in any order, each under the connection's write mutex as one
// writev of header and payload. The reader stops taking requests while the connection has
// Options.MaxInFlightRequests requests in flight, and stops taking READ and WRITE requests while
// its buffers add up to Options.MaxInFlightBytes (FLUSH, TRIM and the others need no buffer and
// are not held back).
//
// Request buffers are anonymous private mappings (mmap), not Go memory, in power-of-two size
// classes from 4 KiB to 32 MiB (a larger request gets a mapping of its own). Each connection
// keeps its own pool and unmaps it when it ends. A buffer is owned by reference count:
//
//   - The request holds one reference from the moment its header is read until its reply is
//     written. The WRITE payload is read straight into the buffer; the READ reply is written
//     straight from it. Without stable pages the Device call given the buffer is its only other
//     user, and it returns to the pool once that call has returned and the reply is written.
//   - With Export.StablePages and a Device that is a PinnedWriter, a WRITE without FUA is handed
//     over with WritePinned, and the device holds a second reference until it calls release,
//     which may be after the reply. From the WritePinned call on, nothing in the server writes
//     to the buffer, and it returns to the pool only when both references are gone: it is never
//     reused, and never unmapped, while the device may still read it. FUA writes are not
//     pinned: they go to WriteAtFUA (or WriteAt and Flush).
//   - With Options.DebugImmutable, a buffer is mprotect'ed read-only from the WritePinned call
//     until the last reference is dropped, then made writable before it is reused. A write to it
//     meanwhile is a SIGSEGV, which the Go runtime reports as a fatal error ("unexpected fault
//     address") that kills the process with a stack trace: a loud stop instead of silently
//     wrong parity. (A test can catch it as a panic with runtime/debug.SetPanicOnFault.)
//   - With Options.MlockBuffers every buffer is mlocked when it is mapped.
//
// Buffers a device holds after their reply stay charged to their connection's
// MaxInFlightBytes: a slow device makes its clients wait instead of making the server map
// memory without bound. Per connection, the buffers out of the pool map at most twice
// MaxInFlightBytes (size classes round up; a single larger request is admitted alone), and the
// pool keeps at most twice MaxInFlightBytes more free. A connection ends, and Serve returns,
// only after its device has released every buffer it holds; one still held ShutdownTimeout
// after the connection is done gets a log line, and is waited for. BufferStats reports the
// mapped, locked and pinned bytes. The hot path allocates nothing, with stable pages or
// without (see BenchmarkRead4K, BenchmarkWrite4K, BenchmarkWrite1M).
//
// On NBD_CMD_DISC, or when Serve's context is done, a connection stops reading, lets the
// requests in flight finish and reply (a client that stops reading gets
// Options.ShutdownTimeout), then closes. Serve returns after every connection has done so.
package nbd

// BUG(nbd): No TLS: NBD_OPT_STARTTLS gets NBD_REP_ERR_UNSUP. Serve loopback or unix sockets,
// or tunnel.
//
// BUG(nbd): No structured replies, metadata contexts (NBD_CMD_BLOCK_STATUS) or extended
// headers; reads are simple replies, so a failed READ carries no partial data.
//
// BUG(nbd): NBD_CMD_CACHE is accepted and ignored, and not advertised; NBD_FLAG_SEND_FAST_ZERO,
// NBD_FLAG_SEND_DF and NBD_FLAG_ROTATIONAL are never set.
//
// BUG(nbd): Shutdown does not answer requests still unread with ESHUTDOWN; it stops reading
// them, and the client sees the connection close.
//
// BUG(nbd): The handshake has no time limit: an idle client holds a goroutine until it
// leaves or the server shuts down.
//
// BUG(nbd): Request buffers are bounded per connection (up to 4 × MaxInFlightBytes mapped), not
// server-wide: many clients map that much each. Bound the number of clients.
//
// BUG(nbd): A PinnedWriter that never releases a buffer holds its connection, and Serve, for
// ever (with a warning after ShutdownTimeout); one that releases only on FLUSH can stall a client
// that writes past MaxInFlightBytes before flushing, since the reader stops before the FLUSH.
//
// BUG(nbd): With MlockBuffers, NewServer checks that one connection's buffers can be locked;
// buffers beyond RLIMIT_MEMLOCK later (many connections) are used unlocked, logged once.
