// Package cache is raid5d's write-back RAID-5 stripe cache, in front of the array's members,
// which it reaches only through the Backend interface: it never touches a file.
//
// A Cache keeps one head per cached stripe, holding per 4 KiB unit (stripe.UnitSize) of each
// data chunk whether it is up to date and whether it is dirty (newer than the members), with its
// data either copied into the head or referenced in a pinned caller buffer (Pin).
//
// A write covering whole stripes goes out at once, parity from the new data alone, with no
// member reads. A partial write lands in its head and returns; background write-outs send a
// head to the members when it has been quiet for WriteBackDelay, at once when every unit is
// dirty (a full-stripe write: no reads), and oldest first once more than half the heads are
// dirty, until no more than 3/8 are. A head whose units are all up to date but only some dirty waits like any partial one
// (its write-out would read nothing, but later writes into the stripe join it). A head whose
// stripe a write is expected in (Expect: the NBD server has admitted a WRITE whose edge it is)
// waits past its delay for that write, up to maxAge delays after its first write. Every
// write-out executes the plan stripe.PlanWrite makes of its head: a head still partial takes
// read-modify-write or reconstruct-write, whichever reads fewer units (a tie:
// read-modify-write). A partial write that finds no free head is written through: into a spare
// head and out to the members before Write returns. Reads are served from up-to-date units and go to
// the members for the rest, so a read sees every write that returned before it started
// (read-your-writes).
//
// Units of a write are copied into the head, unless the caller passes a Pin: then whole aligned
// units are referenced in the caller's buffer, which must not change until the Pin's release
// runs (the stable-pages promise; see raid.IOOptions.StablePages). Whole-stripe writes with
// stable set compute parity and write the members straight from the caller's buffer.
//
// The files follow the jobs: cache.go (the type, New, Start and Close, counters), heads.go
// (heads, unit state, binding and eviction, the LRU and write-out lists), write.go (Write,
// partial and whole-stripe writes), writeout.go (executing a head's plan: its member I/O),
// read.go (ReadExtent, Heads, Dirty), writeback.go (the write-out queues and goroutines, Flush,
// Discard), expect.go (expected writes), pin.go (Pin, Unpin), and invariants_on.go and invariants_off.go (under the
// invariants build tag every write-out re-reads its stripe through the Backend and panics if
// parity does not match the data; without it the checks compile to nothing).
//
// # Locking
//
// A head bound to stripe s is guarded by the stripe lock Locks.For(s) (package stripe), shared
// with the array: every access to its units, and all member I/O for the stripe, happens under
// it. Write-outs hold it for their whole duration, so a write to a stripe being written out
// waits, and a write-out never races a newer write to the same units. Cache.mu guards the table
// of heads, the LRU and write-out lists and each head's binding; it is taken under stripe locks,
// never the other way round.
//
// Every place that holds several stripe locks at once takes them in ascending table order
// (Locks.LockSpan), or takes the extra one only with TryLock, which never waits; together that
// rules out deadlock:
//
//   - the cache's writeFulls, a batch of whole stripes, and writeJoined, a partial stripe and
//     the whole ones after it, under LockSpan;
//   - the cache's eviction (bind): a write holding its stripe's lock takes a clean victim's
//     lock with TryLock, under Cache.mu, and skips the victim when it is busy;
//   - in package raid, Trim of whole stripes (Discard is called under it), and each batch of a
//     rebuild, a scrub or a resync, under LockSpan (WriteOutLocked is called under them).
//
// Everything else holds one stripe lock at a time. All methods may be called concurrently.
package cache
