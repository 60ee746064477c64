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
// # Write plans
//
// PlanWrite is the one place that decides how a stripe is written: from the state of each 4 KiB
// unit of its data chunks (UnitUp, UnitDirty), the member missing in it and whether its parity
// can be trusted, it makes a Plan — per unit column how parity is made (encoded from the data,
// read-modify-written, or not at all when the parity member is missing), the member reads
// that must come first and into which buffer, and the member writes, merged into runs per
// member. It is a pure function: no I/O, no goroutines, no allocation once the Plan's slices
// have grown. The golden files in testdata/plan/ show every case, state in and plan out.
//
// # Stripe locks and member operations
//
// Locks is the table of stripe locks that the array and its write-back cache (package
// stripe/cache) share; MemberOp is one member read or write in a stripe, and UnitSize the 4 KiB
// unit of a stripe's cached state. The package does no I/O and starts no goroutines.
//
// # Concurrency
//
// A Layout is an immutable value; all its methods may be called concurrently. A goroutine that
// holds several stripe locks takes them in ascending table order (Locks.LockSpan), or takes the
// extra ones only with TryLock; see the Locking section of package stripe/cache for every place
// that does.
package stripe
