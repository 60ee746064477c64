// Package raid is raid5d's array: members (files and block devices), the on-disk superblock,
// creating and assembling arrays, and RAID-5 I/O — reads, writes with parity, flush, trim —
// including degraded operation with one member missing.
//
// Create makes an array and Assemble puts one together from its members' superblocks; Examine
// reads the superblocks without assembling. *Array satisfies go-nbd's backend.Backend and the
// nbd package's Device, FUAWriter and PinnedWriter.
//
// # Layout
//
// Every member starts with the same fixed areas; offsets are member offsets in bytes:
//
//	[0, 4 KiB)          untouched (room for a partition table or boot block)
//	[4 KiB, 8 KiB)      the superblock
//	[8 KiB, 1 MiB)      reserved for a write-intent bitmap and a log (later versions);
//	                    zeroed by Create, unused in format version 1
//	[1 MiB, 1 MiB+size) the data area: size = the data size in the superblock, a multiple of
//	                    the chunk size, the same on every member
//
// Within the data areas, chunks are laid out exactly as Linux md lays out RAID-5 (see package
// stripe): stripe s occupies [s×chunk, (s+1)×chunk) of every member's data area, one member holds
// its parity (the XOR of its data chunks) and the others its data. md's default layout,
// left-symmetric, is raid5d's default too. The array's size is (data size / chunk) stripes of
// (members-1)×chunk bytes. Members of unequal size all use the smallest one's data size.
//
// The superblock (4096 bytes, all integers little-endian):
//
//	offset  size  field
//	     0     8  magic "raid5dSB"
//	     8     4  format version (1)
//	    12     4  superblock size (4096)
//	    16    16  array UUID (random, the same on every member)
//	    32    16  device UUID (random, one per member)
//	    48     4  RAID level (5)
//	    52     4  layout: md's algorithm number (0 left-asymmetric, 1 right-asymmetric,
//	              2 left-symmetric, 3 right-symmetric)
//	    56     8  chunk size in bytes (a power of two, 4 KiB to 4 MiB)
//	    64     4  member count (3 to 32)
//	    68     4  this member's role (0 to member count-1)
//	    72     8  data offset in bytes (1 MiB)
//	    80     8  data size per member in bytes (a multiple of the chunk size)
//	    88     8  events counter
//	    96     4  state: 0 clean, 1 dirty
//	   100     4  feature flags (0; later versions: bitmap, log)
//	   104     8  creation time, Unix nanoseconds
//	   112     8  update time, Unix nanoseconds
//	   120     8  write-intent bitmap offset (reserved, 0)
//	   128     8  write-intent bitmap size (reserved, 0)
//	   136     8  log offset (reserved, 0)
//	   144     8  log size (reserved, 0)
//	   152  3940  reserved, zero
//	  4092     4  CRC32C (Castagnoli) of bytes [0, 4092)
//
// A superblock is valid only if its magic, checksum and version match and every field is in
// range; the decoder never panics on garbage (FuzzDecodeSuperblock).
//
// The events counter is bumped, and every present member's superblock rewritten and
// fdatasync'ed, on each state change: creation, assembly with a member missing, the first write
// after assembly (clean → dirty, done before that write is issued) and Close (dirty → clean).
// All present members therefore carry the same count; a member that shows a lower one was out
// of the array while it changed, and Assemble refuses it as stale (ErrStaleMember).
//
// New members are consistent by construction: Create zeroes everything from the superblock to
// the end of the data area with Member.Trim, and all-zero data has all-zero parity, so no
// initial sync is needed. For regular files Trim punches a hole (fallocate
// FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE), which is instant. For block devices the same
// fallocate call asks the kernel to zero the range (it may unmap it, but a later read is
// guaranteed to return zeroes — unlike BLKDISCARD, whose result is unspecified on many
// devices); if the device cannot, raid5d falls back to BLKZEROOUT, and then to writing zeroes.
// On a large device without hardware zeroing, Create therefore takes as long as writing it once.
//
// # Stripe cache and stable pages
//
// Writes go through a write-back stripe cache (package stripe's Cache; IOOptions.StripeCache
// sets its capacity in stripes, default DefaultCacheStripes: 64 MiB worth, 16 to 256 stripes;
// its memory is stripes × members × chunk bytes, allocated as stripes are first cached):
//
//   - A write that covers a whole stripe is written at once, with parity computed from the new
//     data alone and no member reads (counted as FullStripeWrites).
//   - Anything else lands in the stripe's cache head as dirty 4 KiB units and WriteAt returns.
//     Background goroutines (IOOptions.WriteBackers, default 4, stripes in parallel) write a
//     head out once no write has reached it for IOOptions.WriteBackDelay (default 5 ms, at most
//     8 delays after its first write), at once when it has become full (then it is a full-stripe
//     write), and oldest first while more than half the cache is dirty. A partial head is
//     written by read-modify-write or reconstruct-write, whichever reads fewer units; in a
//     degraded stripe, units of the missing member are rebuilt (reconstruct-write) where the
//     cache knows them and read-modify-written where it does not. When every head is dirty, a
//     partial write is written through synchronously instead (WriteThroughs).
//   - Reads copy the units the cache holds (including dirty ones: a read sees every write that
//     returned before it started) and read the rest from the members straight into the caller's
//     buffer. Flush writes out every dirty head, then fdatasyncs the members; WriteAtFUA writes
//     out the stripes it touched, then syncs. Trim and WriteZeroes drop or overwrite the heads
//     they cover. Close writes everything out, syncs and marks the array clean.
//
// IOOptions.StablePages is the caller's promise that a buffer does not change while the array
// reads it. Off (the default), every write is copied into the cache before parity is computed,
// as Linux md does without skip_copy: a caller that changes its buffer mid-write gets one
// version or the other, never parity that disagrees with the data. On, whole-stripe writes
// compute parity from and write members straight from the caller's buffer, and WritePinned
// (nbd.PinnedWriter) keeps whole aligned 4 KiB units of a partial write by reference, not
// copied, until they are written out, then calls release, exactly once. The nbd server keeps
// the promise for its own, pinned request buffers. Breaking it corrupts parity silently
// (TestHazard shows how). StripeCache < 0 disables the cache: every write is written through,
// with its parity, before it returns (the code path before the cache, kept for comparison).
//
// Counters returns what the array did: full-stripe, RMW and RCW writes, member bytes read and
// written, bytes copied into the cache, cache hits, misses and evictions.
//
// # Concurrency
//
// All I/O methods of an Array may be called concurrently. Writes (and trims, and reads that
// rebuild a chunk from the rest of its stripe) hold the stripe's lock, taken from a fixed table
// of 1024 mutexes hashed by stripe number (stripe.Locks). The same lock guards the stripe's
// cache head, and the write-out of a head holds it throughout, so a write to a stripe being
// written out waits for it and is never lost or left out of parity. A request that spans
// stripes takes them one at a time, in ascending order, never holding two; only Trim of whole
// stripes holds several at once, taken in ascending table order, and the cache takes another
// stripe's lock only with TryLock (to evict it), so nothing can deadlock.
// Reads take a stripe's lock only while they copy from its cache head. Like io.ReaderAt on a
// file, a read that overlaps a concurrent write may see old or new bytes, but never
// parity-related garbage, since the bytes read are the member's own data. The member reads of
// one request run concurrently, one goroutine per member; the member reads and writes within
// one stripe run concurrently too (with a cache, on per-member I/O goroutines).
//
// Background goroutines — the cache's write-out goroutines and ioWorkers per member for its
// member I/O — are started by Create and Assemble (not for read-only arrays or without a
// cache) and stopped, and waited for, by Close. Close waits for the calls in flight and makes
// later calls fail with ErrClosed.
//
// WriteAt does not keep p after it returns (with stable pages on, p must not change during the
// call). WritePinned may keep p until it calls release.
//
// # Caveats
//
//   - No write-intent bitmap or journal yet: after a crash (the array assembled dirty, see
//     Status.Unclean) parity may not match data in stripes that were being written — the RAID-5
//     write hole — and nothing resyncs it yet. Such an array stays marked dirty on disk until a
//     resync (a later issue) so the warning is not lost. Writes not yet flushed may be lost in a
//     crash, as NBD allows: they may still be in the stripe cache.
//   - A member that fails is not yet marked faulty: reads it fails are rebuilt from the others
//     while the array is otherwise whole, but write errors are returned to the caller (as
//     *MemberError, EIO) and may leave that stripe's parity stale. An error in a background
//     write-out is logged and returned by the next Flush; the data stays dirty in the cache
//     (and readable), its next write-out reconstructs parity rather than trusting the old, and
//     a pinned buffer stays held until a write-out succeeds. No spares, rebuild or scrub yet.
//   - A crash in the middle of a superblock update can leave members one event apart; Assemble
//     then refuses the one behind as stale, and the array must be assembled without it.
//   - The counters are plain atomics shared by all goroutines, not sharded.
package raid
