// Package bitmap is raid5d's write-intent bitmap: which regions of the array may have parity
// that does not match their data, because a stripe write to them may be in flight or not yet
// synced. After an unclean shutdown only those regions are resynced.
//
// # Layout
//
// The bitmap is the same on every member of a role, at an offset the array chooses: bit r
// (byte r/8, bit r%8, least significant first) covers region r, RegionStripes stripes; it is
// Bytes(n) long (whole pages) and written PageSize bytes at a time, only the pages changed.
// Bits past the last region are zero (Union, and Load through it, refuse anything else:
// ErrCorrupt).
//
// # Rules
//
// A stripe write calls Begin before any member write — it returns once its regions' bits are
// durable on the members — and End after its last one. Writers waiting for bits share one
// write (a group commit). The cleaner (Run) clears, once a second, the bits of regions with no
// write in flight and none begun for ClearDelay, after syncing the members, and only if no
// write began meanwhile. Regions the resync has yet to do are held (Hold, Release) and never
// cleared by the cleaner; ClearAll clears the rest at a clean shutdown.
//
// # Members
//
// The bitmap talks to the array through Members: write pages durably to every working member
// (failing those whose write fails), sync the members, read each member's copy. It knows
// nothing of roles, gates or member errors; those are the array's.
//
// # Errors
//
// Begin and ClearAll return what Members.WritePages returns (the array's failure). Load
// returns a member's read error, or ErrCorrupt.
package bitmap
