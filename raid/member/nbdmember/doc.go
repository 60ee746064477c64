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
// its flags: the TLS files (--member-tls-ca, --member-tls-cert, --member-tls-key) and serve's
// --member-timeout. An nbds URI may name its own TLS files as libnbd does, with the query key
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
//     member's consecutive chunks) send one request per buffer, all in flight at once, so a
//     member's chunks cost one round trip rather than one each.
//   - Sync is FLUSH. A server that does not advertise FLUSH says it has no cache to flush:
//     Sync then returns nil (its writes are as durable as it makes them).
//   - WriteAtDSync (member.DSyncWriter, the bitmap's durable writes) is WRITE with FUA where
//     the server advertises FUA, else WRITE and FLUSH.
//   - Trim is WRITE_ZEROES (without NO_HOLE: the server may deallocate) where advertised,
//     else zeroes written with WRITE (member.WriteZeroes), as a file that cannot punch holes
//     does. TRIM alone is never sent: the protocol leaves a trimmed range's contents
//     undefined, and the array's parity needs zeroes there.
//   - Close sends DISC and closes the connection.
//
// A read-only export (NBD_FLAG_READ_ONLY) opened for member.Exclusive (read-write) is refused
// at Open (ErrReadOnlyExport); Shared and Inspect open read-only.
//
// # Errors and deadlines
//
// Every failed request is an *Error: errno EIO to the array (Errno), whatever the server
// replied, with the cause inside (errors.Is finds client.ErrDisconnected, a syscall.Errno the
// server sent, ErrDeadline). Each request has a deadline, Options.Timeout (the array's member
// timeout): a request that has no reply by then closes the connection, so it and every other
// request in flight return at once with ErrDeadline or client.ErrDisconnected, and every later
// one fails too (a connection is not re-established yet). A server that stops answering, or
// a host that is gone, thus costs the caller one deadline; the array counts the errors, fails
// the member (a failed write fails it at once) and goes on degraded. The dial and the
// handshake share the same bound. An export that cannot be reached at Open (no server
// listening, no such socket, no such export, no answer in time) is ErrUnreachable, which
// wraps fs.ErrNotExist: Assemble counts the member as missing, as it does a file that is not
// there; a TLS or protocol failure is an error that stops it.
//
// # Exclusive use
//
// There is no lock: a remote export has no local file to flock (Kind.Path is nil, so
// raid.SpecPath is ""), and NBD has no way to claim an export. Nothing stops two arrays, or
// two daemons of one array, from opening the same export; serve's control socket stops a
// second daemon on the same host only. Give each export to one array, and prefer servers
// that admit one client (nbd-server's maxconnections = 1, nbdkit's --filter=limit).
package nbdmember
