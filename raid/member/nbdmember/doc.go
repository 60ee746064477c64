// Package nbdmember is the member kind for NBD exports on other hosts (raid/member # Kinds):
// an array member, spare or journal may be
//
//	nbd://host[:port]/export               TCP, port 10809 by default
//	nbds://host[:port]/export              the same over TLS (NBD_OPT_STARTTLS)
//	nbd+unix:///export?socket=PATH         a unix socket
//	nbds+unix:///export?socket=PATH        a unix socket, over TLS
//
// served by any NBD server (nbd-server, nbdkit, qemu-nbd, raid5d itself) through the project's
// pipelined client, nbd/client. cmd/raid5d registers the kind (Register) with the options of
// its flags: the TLS files (--member-tls-ca, --member-tls-cert, --member-tls-key), and serve's
// --member-timeout and --member-conns. An nbds URI may name its own TLS files as libnbd does, with the query key
// tls-certificates=DIR: DIR/ca-cert.pem, and DIR/client-cert.pem with DIR/client-key.pem if
// they exist (mutual TLS); it wins over the flags.
//
// # The Member contract
//
// Name is the URI as given (what the superblocks' configuration records and status shows);
// Size is the size the export announced in the handshake, fixed for the connection, so an
// export of the wrong size is refused by Create and Assemble as a file of the wrong size is
// (raid.ErrMemberTooSmall names the URI). The methods map to NBD requests:
//
//   - ReadAt is READ, WriteAt WRITE: the full length or an error, never a short count (a
//     reply cut short breaks the connection, which is an error). A request longer than the
//     server's maximum block size is split at that maximum (a multiple of its minimum, and
//     never below its preferred size); shorter requests are sent whole. An export whose
//     minimum block size is above 4 KiB, the array's smallest I/O, is refused at Open
//     (ErrBlockSize).
//   - ReadvAt and WritevAt (member.Vectored: the array's merged reads and writes of a
//     member's consecutive chunks) send the buffers as one request (client.Conn's ReadvAt,
//     WritevAt: one writev of the header and every buffer), or, past the server's maximum
//     block size, as several all in flight at once, so a member's chunks cost one request
//     and one round trip rather than one each.
//   - Sync is FLUSH, on every connection (below), and succeeds only if every one does. A
//     server that does not advertise FLUSH says it has no cache to flush: Sync then returns
//     nil (its writes are as durable as it makes them).
//   - WriteAtDSync (member.DSyncWriter, the bitmap's durable writes) is WRITE with FUA where
//     the server advertises FUA, else WRITE and FLUSH.
//   - Trim is WRITE_ZEROES (without NO_HOLE: the server may deallocate) where advertised,
//     else zeroes written with WRITE (member.WriteZeroes), as a file that cannot punch holes
//     does. TRIM alone is never sent: the protocol leaves a trimmed range's contents
//     undefined, and the array's parity needs zeroes there.
//   - Close sends DISC and closes the connections.
//
// A read-only export (NBD_FLAG_READ_ONLY) opened for member.Exclusive (read-write) is refused
// at Open (ErrReadOnlyExport); Shared and Inspect open read-only.
//
// # Errors and deadlines
//
// Every failed request is an *Error: errno EIO to the array (Errno), whatever the server
// replied, with the cause inside (errors.Is finds client.ErrDisconnected, a syscall.Errno the
// server sent, ErrDeadline, ErrLostWrites, ErrExportChanged). Each request has a deadline,
// Options.Timeout (the array's member timeout), which covers the time it waits for a
// reconnect too: a request that has no reply by then closes its connection (a break, below)
// and returns ErrDeadline. A server that stops answering, or a host that is gone, thus costs
// the caller one deadline; the array counts the errors, fails the member (a failed write
// fails it at once) and goes on degraded. Open's dial and handshake share the same bound. An
// export that cannot be reached at Open (no server listening, no such socket, no such
// export, a connection reset or closed during the handshake, no answer in time, or none
// before OpenContext's context ended) is ErrUnreachable, which wraps fs.ErrNotExist:
// Assemble tries it again within its wait (raid.AssembleOptions.WaitRemote, serve
// --assemble-timeout), then counts the member as missing, as it does a file that is not
// there; a TLS or protocol failure is an error that stops it.
//
// # Reconnecting
//
// A connection that breaks (the server restarted, a reset, EOF, a request past its deadline)
// is dialed again, with the same URI and TLS settings, by the requests that need it: the
// first dial at once, then with a backoff doubling from 50 ms to 1.6 s while dials fail (or
// new connections break again within a few seconds), each request waiting at most until its
// own deadline. Reads cut off by the break are sent again
// on the new connection, and so is any request the break kept from being sent. The new
// handshake must announce the export as Open's did (the same size, the flags the member uses,
// block sizes its requests fit), and pass the owner's recheck (SetRecheck, member.Rechecker:
// the array reads the export's superblock, which must still be this member's); a server that
// comes back different, or with another disk of the same size behind the URI, is refused and
// the member failed (ErrExportChanged); with several connections each must pass, and one that
// reaches another export fails the member too. Reconnects are counted (Member.reconnects, in
// Report).
//
// A server acknowledges a WRITE once it holds the data, in its cache perhaps; only FLUSH (or
// FUA) makes it durable. A server that restarted has lost its cache, and nothing on the wire
// says whether it restarted or the network dropped a connection. So the member reconnects
// only when a break cannot have lost anything the array was told was written: none of the
// connections had a WRITE (or WRITE_ZEROES) acknowledged since the last FLUSH that covered it
// (a FLUSH counts for the writes whose replies came before it was sent, once it succeeded on
// every connection), or the server advertised no FLUSH (it has no cache: its
// acknowledgements are durable); and no write's reply was cut off by the break (it may have
// been applied or not — or, if the server's old session still runs, be applied late, over a
// newer write sent again on the new connection). Otherwise the member has failed
// (ErrLostWrites): the requests in flight and every later one return the error, with the
// break's cause, so the array fails the member and a bitmap re-add (of a member opened
// afresh: a failed Member stays failed) resyncs it later. Letting
// the next FLUSH succeed on a new connection would instead have the array believe data was
// durable that the server had dropped.
//
// A break retires every connection of the member at once, even those that still work: a
// server restart breaks them all, and a read on a new connection must not return what the
// restart lost before a write acknowledged on an old one has been accounted for. The verdict
// is given once every request on the retired connections has returned, so none is missed.
//
// # Several connections
//
// With Options.Conns above one (serve's --member-conns) and a server that advertises
// NBD_FLAG_CAN_MULTI_CONN — it promises that what one connection wrote is what the others
// read, and that a FLUSH on one covers the writes the others completed — the member opens that
// many connections and sends each request on the one with the fewest in flight. Open makes
// one; the others are opened when the owner sets its recheck (SetRecheck: the array does once
// the export carries the member's superblock), and every one must prove it reaches the same
// export before it carries a request, by the same admission as a reconnection's (its
// handshake announcing the export the same way, and the recheck): a server that routes them
// to different disks fails the member and SetRecheck returns ErrExportChanged, which the
// array's assembly returns. The connection in use is rechecked then too. A member with no
// recheck set keeps one connection. A server that does not advertise CAN_MULTI_CONN gets one
// connection, which is logged at Info once; one that refuses the extra connections (a limit
// on its clients) gets as many as it admitted, logged at Warn. Sync
// sends FLUSH on every connection all the same, and succeeds only if all of them do. A
// break of one connection retires them all, and the reconnect makes as many again (see
// Reconnecting).
//
// # Status
//
// Member is a member.Reporter (stats.go): Report gives the export's name, the server's
// transmission flags by name (FlagNames) and block sizes, the connections and reconnects,
// the link (connected, reconnecting while requests wait for a new connection, down once the
// member failed or closed, or broken with nothing waiting), and every request's count and
// time from its call to its return, reconnect waits included: in flight, answered and
// failed since Open, and the mean and longest over the last interval (about 10 s). The raid
// package's Status carries it; `raid5d status` and the metrics show it.
//
// # Exclusive use
//
// There is no lock: a remote export has no local file to flock (Kind.Path is nil, so
// raid.SpecPath is ""), and NBD has no way to claim an export. Nothing stops two arrays, or
// two daemons of one array, from opening the same export; serve's control socket stops a
// second daemon on the same host only. Give each export to one array, and prefer servers
// that admit one client (nbd-server's maxconnections = 1, nbdkit's --filter=limit), or as
// many as Options.Conns.
package nbdmember
