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
// The wire format is doc/proto.md of the NBD reference implementation; its constants and
// header layouts are in nbd/internal/wire, shared with the client (nbd/client), on top of
// go-nbd's protocol package (its values and header structs, where it has them). The files follow the protocol's phases: server.go (listeners, connections), handshake.go
// (greeting and options), transmission.go (the transmission loop: read a request, call the
// Device, reply), with request.go (request headers, their checks, WRITE payloads), reply.go
// (simple and structured replies and their coalescing), blockstatus.go (NBD_CMD_BLOCK_STATUS),
// pool.go (request buffers and each connection's in-flight bounds) and limits.go (the
// server-wide budget).
//
// Handshake: the server offers NBD_FLAG_FIXED_NEWSTYLE and NBD_FLAG_NO_ZEROES and drops a client
// that sets any other client flag. It answers NBD_OPT_EXPORT_NAME (size, flags, and 124 zero
// bytes unless the client chose NO_ZEROES), NBD_OPT_INFO and NBD_OPT_GO (NBD_INFO_EXPORT;
// NBD_INFO_NAME and NBD_INFO_DESCRIPTION when asked, the latter if the export has one;
// NBD_INFO_BLOCK_SIZE always, since the
// server enforces it), NBD_OPT_LIST, NBD_OPT_ABORT (ACK, then close), NBD_OPT_STARTTLS (see
// Security), NBD_OPT_STRUCTURED_REPLY (ACK; NBD_REP_ERR_INVALID if it carries data) and the
// metadata-context options (see Structured replies). Every other option, EXTENDED_HEADERS
// included, gets NBD_REP_ERR_UNSUP with its data consumed, so the client may carry on. An
// unknown name gets NBD_REP_ERR_UNKNOWN, except after NBD_OPT_EXPORT_NAME, which cannot fail
// politely: the connection closes. So does an option announcing more than 64 KiB of data.
// The empty name is the first export.
//
// Transmission: the flags say what the Device interface offers: HAS_FLAGS, SEND_FLUSH,
// SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES and CAN_MULTI_CONN (Device.Flush makes every completed
// write durable, whichever connection made it), and SEND_DF once structured replies are on; a
// read-only export has READ_ONLY instead of FUA, TRIM and WRITE_ZEROES. READ, WRITE (FUA via
// FUAWriter when the Device has it, else WriteAt then Flush; without FUA via PinnedWriter when
// Export.StablePages is on), FLUSH, TRIM, WRITE_ZEROES (NO_HOLE and FUA honoured), CACHE
// (checked, then ignored), BLOCK_STATUS (see Structured replies) and DISC are served. A request the server refuses gets a reply with an error
// and the connection goes on: EINVAL for an unknown command or flag, a READ, TRIM or CACHE past
// the end, a misaligned offset or length (Export.MinBlock), or a READ longer than MaxBlock;
// ENOSPC for a WRITE or WRITE_ZEROES past the end; EPERM for writes to a read-only export. A
// failed Device call is answered with the error's own value (an Errno() uint32 method, see
// Device) or the nearest one for a syscall.Errno, else EIO. Besides DISC, shutdown and
// Options.IdleTimeout, only a broken stream closes the connection, with a log line saying why: a bad request magic (ErrBadRequestMagic), a WRITE
// payload above MaxBlock (ErrPayloadTooLarge: the server will neither buffer nor skip it), a
// WRITE payload that does not arrive within Options.PayloadTimeout (ErrPayloadTimeout), an I/O
// error on the socket, or a reply write that takes longer than Options.ReplyTimeout.
//
// # Structured replies
//
// A client that sends NBD_OPT_STRUCTURED_REPLY gets structured replies to every request,
// each one chunk with NBD_REPLY_FLAG_DONE: NBD_REPLY_TYPE_OFFSET_DATA for a READ's data (the
// offset goes with the header, and the data is written from the request buffer in the same
// writev as before: no copy, no allocation), NBD_REPLY_TYPE_NONE for a READ of 0 bytes and
// every other success, NBD_REPLY_TYPE_BLOCK_STATUS for a BLOCK_STATUS, and for an error
// NBD_REPLY_TYPE_ERROR with a short message ("READ: invalid argument"; never the Device's
// error text, which may name server paths), or NBD_REPLY_TYPE_ERROR_OFFSET for a failed READ
// (at the offset ReadAt stopped at; no partial data is sent). A READ is never answered with a
// simple reply then, not even when the reader refuses it. NBD_CMD_FLAG_DF is accepted, and
// NBD_FLAG_SEND_DF advertised, since a READ is always one chunk. STARTTLS forgets structured
// replies and the selected context, as the protocol asks.
//
// Metadata contexts: the server knows one, base:allocation. NBD_OPT_LIST_META_CONTEXT lists
// it for no query, "base:" or "base:allocation"; NBD_OPT_SET_META_CONTEXT selects it for
// "base:allocation" (context id 1, on every connection). Other leaf names and namespaces match
// nothing without error; a query without a namespace, malformed data, or either option before
// STRUCTURED_REPLY gets NBD_REP_ERR_INVALID, an unknown export NBD_REP_ERR_UNKNOWN. The
// selection holds for the export it named: NBD_CMD_BLOCK_STATUS is served only when the same
// export is then chosen, and gets EINVAL otherwise, or for 0 bytes or a range past the end
// (its length need not be aligned: it is a hint). The answer comes from the Device's
// BlockStatus (BlockStatuser) for at most 1 GiB from the offset, with neighbours of the same
// flags merged, at most 4096 extents (one with NBD_CMD_FLAG_REQ_ONE), never past the asked
// range; a Device without BlockStatus is reported as data (flags 0), which is always true.
//
// # Concurrency and buffer ownership
//
// Serve runs one goroutine per connection and tracks them with a WaitGroup. Within a
// connection, that goroutine reads and decodes requests and hands each to a worker; workers
// (started on demand, never more than the requests in flight) call the Device concurrently and
// reply as they complete, in any order. Replies are coalesced: a worker queues its reply and,
// unless another worker is writing, writes every queued reply with one writev, so a lone reply
// goes out at once and replies that complete during a write go out together in the next.
// The reader stops taking requests while the connection has
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
//   - With a Device that is a PlacedWriter, on a connection without TLS, a WRITE without FUA of
//     at least 16 KiB, none of whose payload the connection's buffered reader holds, is
//     offered to PlaceWrite first, in pieces cut at multiples of its unit (PlaceUnit) whose bytes have all
//     arrived in the socket's receive queue, waiting up to 2 ms with nothing held for a piece
//     still arriving: for each piece the device takes, the reader reads its bytes straight into
//     the device's slices with readv (one, or for a PlacedProgresser one per ~192 KiB, each
//     followed by PlacedReceived) and calls CommitPlaced. Only the kernel copies into the
//     slices: a copy from the buffered reader in user space could be cut anywhere by the
//     daemon's death, tearing the device's 4 KiB units. The rest of a WRITE that is not placed goes
//     to a worker as an ordinary WRITE of that range, whose reply answers the whole; a WRITE
//     placed whole has no buffer, and its reply goes out as a worker's would. The reader never
//     waits for the client while the device holds the slices.
//   - With a Device that is a CachedWriter, a WRITE without FUA whose whole payload the
//     connection's buffered reader already holds is read into its request buffer and offered
//     to WriteCached, by the reader: taken, it needs no worker, and its reply is held back, as
//     a placed write's is, to go out with the replies of the requests that have already
//     arrived; declined, it goes to a worker and is written as usual.
//   - With Options.DebugImmutable, a buffer is mprotect'ed read-only from the WritePinned call
//     until the last reference is dropped, then made writable before it is reused. A write to it
//     meanwhile is a SIGSEGV, which the Go runtime reports as a fatal error ("unexpected fault
//     address") that kills the process with a stack trace: a loud stop instead of silently
//     wrong parity. (A test can catch it as a panic with runtime/debug.SetPanicOnFault.)
//   - With Options.MlockBuffers every buffer is mlocked when it is mapped.
//
// Server-wide, Options.MaxTotalInFlightBytes is shared by every connection (see Limits): a
// READ is charged in full when its header is read, a WRITE as its payload arrives, 1 MiB
// ahead of it (a WRITE of up to 1 MiB in full), so a client that announces a large WRITE and
// then stalls holds no more of the server-wide budget than it has sent, plus 1 MiB. Its own
// connection's MaxInFlightBytes is charged in full at once.
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
// # Security
//
// TLS: with Options.TLSConfig (LoadTLSConfig builds one from PEM files) the server answers
// NBD_OPT_STARTTLS with NBD_REP_ACK and runs a crypto/tls handshake (TLS 1.2 or later) on the
// connection; everything after it, option haggling and transmission, goes through the TLS
// session. Options.TLSMode picks the protocol's mode: TLSRequire (FORCEDTLS, the default when
// TLSConfig is set) answers every option but STARTTLS and ABORT with NBD_REP_ERR_TLS_REQD
// until the upgrade, and closes the connection on an NBD_OPT_EXPORT_NAME before it
// (ErrTLSRequired); TLSOn (SELECTIVETLS) serves plaintext clients as well; TLSOff answers
// STARTTLS with NBD_REP_ERR_UNSUP. A second STARTTLS, or one with data, gets
// NBD_REP_ERR_INVALID. A failed TLS handshake closes the connection (ErrTLSHandshake): with
// ClientAuth RequireAndVerifyClientCert (LoadTLSConfig with a client CA file) that is every
// client without a certificate signed by those CAs.
//
// Access: Export.AllowedClients names the client certificates (subject CN or DNS SAN of a
// certificate the TLS configuration verified) and Export.AllowedUIDs the unix socket peers
// (SO_PEERCRED) that may use an export; with neither, everyone who got through the handshake
// may. Others do not see the export in NBD_OPT_LIST, get NBD_REP_ERR_POLICY to NBD_OPT_INFO and
// NBD_OPT_GO (NBD_REP_ERR_TLS_REQD while STARTTLS could still help), and are disconnected after
// NBD_OPT_EXPORT_NAME (ErrAccessDenied); each refusal is a log line. NewServer refuses
// AllowedClients unless client certificates are verified.
//
// Limits, each with a log line (attribute "limit" naming the option) when it is hit:
//
//   - Options.MaxConnections (DefaultMaxConnections, 128) connections at once, server-wide;
//     one more is closed before the greeting (ErrTooManyConnections): the protocol has no way
//     to refuse a client before option haggling, and haggling with it would hold what the
//     limit is there to bound. Logged at most once a second.
//   - Options.HandshakeTimeout (DefaultHandshakeTimeout, 10 s) for the whole handshake, TLS
//     included (ErrHandshakeTimeout): a client that connects and says nothing, or haggles for
//     ever, is dropped.
//   - Options.IdleTimeout (none by default): a connection with nothing in flight and no
//     request for that long is closed (ErrIdleTimeout). Requests the device is slow to serve
//     do not count as idle.
//   - Options.ReplyTimeout (DefaultReplyTimeout, 30 s) for each reply write: a client that
//     stops reading its socket is closed once a write has been blocked that long
//     (ErrReplyTimeout), and the buffers its replies held go back, instead of staying
//     charged to MaxInFlightBytes and MaxTotalInFlightBytes. During shutdown, the earlier of
//     it and ShutdownTimeout applies.
//   - Options.PayloadTimeout (DefaultPayloadTimeout, 30 s) for each WRITE payload, from the
//     first read that waits for it (time the reader spends waiting for the server-wide budget
//     does not count): a payload not complete by then closes the connection with a log line
//     giving the bytes received and expected and the offset (ErrPayloadTimeout), and its
//     budget returns. It is a fixed bound rather than a deadline pushed back by each byte
//     that arrives: with that, a client trickling a byte now and then would hold its buffer
//     for as long as it liked. 30 s asks about 1 MiB/s of a 32 MiB write; raise it for
//     clients on slow links that send large writes. The payload of a refused WRITE, skipped
//     to stay in sync, has the same bound.
//   - Options.MaxInFlightBytes and MaxInFlightRequests per connection (see Concurrency), and
//     Options.MaxTotalInFlightBytes (DefaultMaxTotalInFlightBytes, 1 GiB) across connections:
//     a reader whose READ or WRITE would pass it waits for other requests to finish (logged
//     at most once a second). While readers wait they are served in order, except that a
//     connection holding more than its share (the budget divided by the connections in the
//     transmission phase; one holding nothing is always within it) waits until no
//     connection within its share is waiting: under contention one connection, or each of
//     many, gets about its share. A payload already being received goes first, and one at a
//     time may pass the bound, by at most its own length, so that payloads charged as they
//     arrive never wait for one another. Every wait ends: what is held comes back when
//     requests complete, when a payload misses its deadline, or when a reply write gives up.
//   - Request sizes: a READ or WRITE is at most Export.MaxBlock (32 MiB by default); a WRITE
//     announcing more closes the connection before its payload is read. TRIM and
//     WRITE_ZEROES carry no payload and get no buffer; their length (32 bits, so under 4 GiB)
//     is only checked against the export's size and passed to the Device.
//   - Option data is at most 64 KiB (ErrOptionTooLong), names at most 4096 bytes.
//
// Nothing a client sends makes the server allocate beyond these bounds: per connection one
// 64 KiB read buffer (two under TLS), option data up to 64 KiB, request buffers bounded as
// described in Concurrency, and request structs up to MaxInFlightRequests.
//
// On NBD_CMD_DISC, or when Serve's context is done, a connection stops reading, lets the
// requests in flight finish and reply (a client that stops reading gets
// Options.ShutdownTimeout), then closes. Serve returns after every connection has done so.
//
// # Errors
//
// The sentinels are in errors.go; match them with errors.Is, through the detail they are
// wrapped with. Calls return only these:
//
//   - NewServer: ErrNoExports, ErrInvalidExport (a nil Device, a duplicate or over-long name,
//     block sizes the protocol does not allow, AllowedClients without verified client
//     certificates), ErrInvalidOptions (a negative limit, an unknown TLSMode or one that
//     needs a TLSConfig without it; ParseTLSMode returns it too for an unknown name), and
//     ErrMemlockLimit (MlockBuffers beyond RLIMIT_MEMLOCK without CAP_IPC_LOCK).
//   - LoadTLSConfig: ErrTLSConfig, when a certificate, key or CA file cannot be loaded.
//
// Serve returns nil once its context is done, or its listener's Accept error. Everything else
// that goes wrong ends one connection, not a call: the server closes the connection and logs
// the sentinel under the key "err" (tests find it in the log records):
//
//   - Protocol violations in the handshake: ErrClientFlags (a client flag not offered),
//     ErrBadOptionMagic, ErrOptionTooLong (option data over 64 KiB), ErrUnknownExport
//     (NBD_OPT_EXPORT_NAME of an export that does not exist); in transmission:
//     ErrBadRequestMagic, ErrPayloadTooLarge (a WRITE above MaxBlock).
//   - Refusals in the handshake: ErrTLSRequired (NBD_OPT_EXPORT_NAME before STARTTLS under
//     TLSRequire), ErrTLSHandshake (the TLS handshake after STARTTLS failed), ErrAccessDenied
//     (NBD_OPT_EXPORT_NAME of an export the allow-lists close to the client).
//   - Limits: ErrTooManyConnections (past MaxConnections, before the greeting),
//     ErrHandshakeTimeout, ErrIdleTimeout, ErrReplyTimeout and ErrPayloadTimeout (past
//     HandshakeTimeout, IdleTimeout, ReplyTimeout and PayloadTimeout).
//
// A failed Device call is none of these: its error is answered to the client as an NBD error
// value (see Device) and the connection goes on.
package nbd

// BUG(nbd): Under TLS each reply's header and payload are TLS records of their own, written
// without writev (replies written together still make a record each), and every byte is
// copied through the cipher; the zero-allocation figures of the benchmarks are for plaintext
// connections. No TLS-PSK, no session resumption tuning and no
// certificate reload without a restart.
//
// BUG(nbd): A client that stops reading its replies keeps its requests' buffers charged to
// MaxInFlightBytes and MaxTotalInFlightBytes for up to ReplyTimeout; enough such clients can
// fill the server-wide budget and make the others wait that long. Likewise clients that send
// most of large WRITE payloads and then stall hold what they sent for up to PayloadTimeout.
// Shares order the waiting readers; they do not take back what a connection already holds.
//
// BUG(nbd): Clients refused access to an export (Export.AllowedClients, AllowedUIDs) are
// logged each time, and so is an NBD_OPT_EXPORT_NAME before STARTTLS under TLSRequire,
// without the rate limit the connection and memory limits have; HandshakeTimeout bounds how
// many refusals one connection can cause. (An option answered NBD_REP_ERR_TLS_REQD is not
// logged.)
//
// BUG(nbd): No extended headers (64-bit lengths); no NBD_REPLY_TYPE_OFFSET_HOLE (a READ of a
// hole sends its zeroes); a failed READ carries no partial data; no metadata context but
// base:allocation.
//
// BUG(nbd): NBD_CMD_CACHE is accepted and ignored, and not advertised; NBD_FLAG_SEND_FAST_ZERO
// and NBD_FLAG_ROTATIONAL are never set.
//
// BUG(nbd): Shutdown does not answer requests still unread with ESHUTDOWN; it stops reading
// them, and the client sees the connection close.
//
// BUG(nbd): MaxTotalInFlightBytes bounds the buffers in use server-wide, not those mapped:
// each connection's pool keeps up to 2 × MaxInFlightBytes free on top (so up to
// MaxConnections × 4 × MaxInFlightBytes of address space, touched only as clients use it). A
// WRITE's buffer is mapped (or taken from the pool) whole when its header arrives, though its
// budget is charged as the payload comes.
//
// BUG(nbd): A PinnedWriter that never releases a buffer holds its connection, and Serve, for
// ever (with a warning after ShutdownTimeout); one that releases only on FLUSH can stall a client
// that writes past MaxInFlightBytes before flushing, since the reader stops before the FLUSH.
//
// BUG(nbd): With MlockBuffers, NewServer checks that one connection's buffers can be locked;
// buffers beyond RLIMIT_MEMLOCK later (many connections) are used unlocked, logged once.
