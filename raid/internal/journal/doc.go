// Package journal is raid5d's write journal, the journal consistency policy: before a stripe
// operation issues any member write, Log appends a record holding every byte it will write
// (and every trim) to a ring on a device of its own and returns once the record is durable;
// concurrent callers share one write and sync (a group commit). A checkpoint reclaims the
// records whose member writes have completed, once the members are synced. After a crash
// Recover replays the records since the tail, completing every logged stripe operation, so
// parity matches data again without a resync, whole or degraded.
//
// # Layout
//
// Two header slots of 4 KiB (a checkpoint writes the one its generation selects, so a torn
// header write leaves the other readable), then the ring from RingOffset. A record is a
// header block — an 88-byte fixed part, then a 24-byte descriptor per op, zero-padded to
// whole pages — followed by the payload of its write ops, zero-padded to whole pages. Each
// record carries the array's UUID, its sequence number, its logical position (bytes since
// the journal was created, so records of earlier laps never pass) and its group's commit
// point; one checksum covers the fixed part, another the rest. A pad record fills the end of
// the ring. See format.go for the fields.
//
// # The array
//
// The journal talks to the array through Array (apply a replayed op to the member of its
// role, sync the members, ask whether a resync is pending) and to its device through Device
// (the raid Member interface plus a vectored write). It knows nothing of member failure.
//
// # Errors
//
// ErrUnusable: the journal cannot be used (header unreadable or another array's, a record
// too large for the ring, a write or sync of the device failed — sticky until the array is
// reassembled). ErrCorrupt: Recover found a damaged record that a later record proves was
// durable; nothing was replayed or written. Errors of Array's methods are returned as they
// are.
package journal
