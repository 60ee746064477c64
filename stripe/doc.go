// Package stripe is raid5d's RAID-5 geometry: how an array offset maps to a stripe, a data
// chunk, a member and an offset in that member, and which member holds each stripe's parity.
//
// # Layouts
//
// The four layouts are Linux md's (raid5_compute_sector in drivers/md/raid5.c), with md's
// numbering. With N members and chunk c, array chunk k lies in stripe k/(N-1) as data chunk
// d = k%(N-1); the stripe occupies bytes [stripe·c, (stripe+1)·c) of every member's data area.
//
//	left-asymmetric:  P = N-1 - stripe%N   D = d if d < P else d+1
//	right-asymmetric: P = stripe%N         D = d if d < P else d+1
//	left-symmetric:   P = N-1 - stripe%N   D = (P+1+d) % N     (default)
//	right-symmetric:  P = stripe%N         D = (P+1+d) % N
//
// The grids in testdata/ show each layout for a few member counts; the tests compare them, and
// real md member images, byte for byte.
//
// # The stripe cache
//
// Cache is the write-back stripe cache in front of the members (which it reaches only through
// the Members interface: it never touches a file). It keeps one head per cached stripe, with
// per-4 KiB-unit up-to-date and dirty state. A write covering whole stripes goes out at once,
// parity from the new data alone, with no member reads. A partial write lands in its head and
// returns; background write-outs send a head to the members when it has been quiet for
// WriteBackDelay, at once when it has become full (then, too, with no reads), and oldest first
// when more than half the heads are dirty. A head still partial when written out takes
// read-modify-write or reconstruct-write, whichever reads fewer units. Reads see every write,
// dirty or not (read-your-writes).
//
// Units of a write are copied into the head, unless the caller passes a Pin: then whole aligned
// units are referenced in the caller's buffer, which must not change until the Pin's release
// runs (the stable-pages promise; see raid.IOOptions.StablePages). Whole-stripe writes with
// stable set compute parity and write the members straight from the caller's buffer.
//
// # Concurrency
//
// A Layout is an immutable value; all its methods may be called concurrently. A Cache's methods
// may be called concurrently; each head is guarded by its stripe's lock in Locks, which a
// write-out holds from planning to the last member write, so a write that arrives meanwhile
// waits for it rather than being lost. Requests spanning stripes take the locks one stripe at a
// time in ascending order.
package stripe
