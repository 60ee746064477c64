// Package raid is raid5d's array: members (opened through package raid/member: files, block
// devices and the kinds registered there), the on-disk superblock, creating and assembling
// arrays, and RAID-5 I/O — reads, writes with parity, flush, trim — including degraded operation with one member missing, member failure, spares, rebuild,
// scrub, and crash consistency (a write-intent bitmap and the resync after an unclean
// shutdown, or a write journal replayed at assembly).
//
// Create makes an array and Assemble puts one together from its members' superblocks; Examine
// reads the superblocks without assembling. Members that fail are marked faulty and the array
// runs degraded; spares take over by themselves, rebuilt in the background; StartScrub checks
// or repairs parity; Fail, Remove, AddSpare, Replace and SetSyncSpeed manage a live array.
// *Array satisfies go-nbd's backend.Backend and the nbd package's Device, FUAWriter,
// PinnedWriter and MappedReader (cmd/raid5d asserts it); BlockStatus describes holes (for
// NBD's base:allocation) in raid's own Extent type, since raid does not import nbd (cmd/raid5d
// translates).
//
// # Layout
//
// Every member starts with the same fixed areas; offsets are member offsets in bytes:
//
//	[0, 4 KiB)          untouched (room for a partition table or boot block)
//	[4 KiB, 8 KiB)      the superblock
//	[8 KiB, 8 KiB+B)    the write-intent bitmap, B = bitmap size in the superblock (whole
//	                    4 KiB pages), if the bitmap feature flag is set
//	[8 KiB+B, 1 MiB)    reserved (a log, later); zeroed by Create
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
//	    68     4  this member's role (0 to member count-1), or 0xFFFFFFFF (-1) for an idle spare
//	    72     8  data offset in bytes (1 MiB)
//	    80     8  data size per member in bytes (a multiple of the chunk size)
//	    88     8  events counter
//	    96     4  state: 0 clean, 1 dirty
//	   100     4  feature flags: bit 0 write-intent bitmap, bit 1 write journal; other
//	              bits unknown (refused)
//	   104     8  creation time, Unix nanoseconds
//	   112     8  update time, Unix nanoseconds
//	   120     8  write-intent bitmap offset: 8192 with the bitmap flag, else 0
//	   128     8  write-intent bitmap size in bytes: ceil(regions/8) rounded up to 4 KiB
//	              (regions = ceil(stripes / stripes per region)), else 0
//	   136     8  log offset (reserved, 0)
//	   144     8  log size (reserved, 0)
//	   152     8  rebuild checkpoint: bytes of the data area rebuilt onto the member whose
//	              role's state is 2 (rebuilding); 0 otherwise
//	   160    32  per-role state table, one byte per role (roles ≥ member count: 0):
//	              0 active, 1 faulty (no working member: failed or missing), 2 rebuilding
//	   192     8  write-intent bitmap region: stripes per bit (a power of two), else 0
//	   200     4  write journal path: length in bytes (at most 1024), 0 without bit 1
//	   204  1024  write journal path (absolute, as Create was given it), zero-padded
//	  1228     4  reserved, zero
//	  1232     8  resync resume point: bytes of the data area a full resync (no bitmap, no
//	              journal) had done when Close stopped it; set only with state 1, else 0
//	  1240     8  bitmap cleared mark (md's events_cleared): the events counter of the last
//	              superblock update written while every role was active, 0 unknown
//	  1248  2844  reserved, zero
//	  4092     4  CRC32C (Castagnoli) of bytes [0, 4092)
//
// A superblock is valid only if its magic, checksum and version match and every field is in
// range; the decoder never panics on garbage (FuzzDecodeSuperblock). The spare role, the
// checkpoint and the state table live in what format version 1 reserved as zero, so the
// version stays 1: older superblocks read as "every role active, no rebuild". A build from
// before spares refuses a spare's superblock (role out of range) and ignores the table.
//
// The journal fields live in what version 1 reserved as zero, and bit 1 is a feature flag, so
// the version stays 1: a build from before the journal refuses such an array (unknown
// feature), as it must — it would assemble it without replaying the journal.
//
// The bitmap cleared mark also lives in what version 1 reserved as zero, with no feature flag:
// a build from before it writes 0 there, and 0 means "unknown", which only refuses a re-add
// (ErrCannotReAdd: `add` rebuilds the member fully instead), never trusts a bitmap that such a
// build may have cleared while the array was degraded.
//
// The write journal (consistency policy "journal") is a separate file or block device, all
// integers little-endian:
//
//	[0, 4 KiB)      header slot 0
//	[4 KiB, 8 KiB)  header slot 1: the valid slot with the higher generation is current; a
//	                checkpoint writes generation g+1 to slot (g+1)%2, so a torn header write
//	                leaves the previous one
//	[8 KiB, size)   the ring of records, in whole 4 KiB pages
//
// A header: magic "raid5dJH" (0, 8), version 2 (8, 4), header size 4096 (12, 4), array UUID
// (16, 16), journal size (32, 8), ring offset 8192 (40, 8), ring size (48, 8), tail: logical
// position of the oldest record to replay, in bytes since creation (56, 8), the sequence number
// that record must carry (64, 8), generation (72, 8), creation time (80, 8), flags: 1 a full
// resync follows any replay (88, 4), CRC32C of [0, 4092) (4092, 4). A record starts on a page:
// magic "raid5dJR" (0, 8), type 3 ops or 4 pad (8, 4), op count (12, 4), sequence number
// (16, 8), logical position (24, 8), length in bytes, whole pages (32, 8), array UUID (40, 16),
// first stripe and stripe count (56, 8+8), commit point: every record numbered below it was
// durable when this one was written (72, 8), CRC32C of everything after byte 88 (80, 4),
// CRC32C of [0, 84) (84, 4); then one descriptor
// of 24 bytes per op — role (4), flags: 1 trim (4), member offset (8), length (8) — padded
// to whole pages; then the payload, the bytes of the write ops one after another, padded to
// whole pages. A pad record is one header page whose length reaches the end of the ring (a
// record never wraps); its checksum covers its header page only. Version 1 (an older
// raid5d: no flags, records of types 1 and 2 without a commit point, both checksums 8 bytes
// earlier) is read as far as its header: a clean array's journal is used and rewritten as
// version 2 at its first checkpoint; records of version 1 left to replay are refused
// (ErrJournal, below).
//
// The events counter is bumped, and every working member's superblock (spares included,
// faulty members never) rewritten and fdatasync'ed, on each state change: creation, assembly
// with a member missing, the first write after assembly (clean → dirty, done before that write
// is issued), a member marked faulty, a spare added or removed, a rebuild started, its
// checkpoints and its end, and Close (dirty → clean). All working members therefore carry the
// same count; a member that shows a lower one, or whose role the others record as faulty, was
// out of the array while it changed (stale). Assemble leaves it out (closed), as md kicks a
// device that is not fresh, and assembles the array without it if it can — degraded, or whole
// if a spare took its role over — or, with AssembleOptions.RebuildStale, takes it as a fresh
// spare and rebuilds it; the log says which. If too few members are left, Assemble refuses
// with ErrTooManyMissing (and ErrStaleMember when stale members were given).
//
// A failed array — two roles without a current member — can often be brought back whole
// (AssembleOptions.Force, serve --force, like mdadm --assemble --force). A member misses a
// superblock update only by failing (or being absent from an assembly, which records it the
// same way), so its own superblock shows the array as it was when it stopped. If that
// already records another role faulty or rebuilding (agreeing with the freshest superblock:
// a role being rebuilt counts as lost, see # Failure and rebuild), its failure was the
// array's second loss: every later write was refused
// (ErrArrayFailed), so its data holds every acknowledged write. So does a member that failed
// together with another role's, in one batch of member writes: both stopped at the same events
// counter, neither superblock records the other's failure, and the update that recorded the
// first left two roles lost, failing the array with them (a write that skips a failed member is
// acknowledged only after that record, and refused when it leaves two roles lost). Force
// trusts such members with the fresh ones — all of those that failed together, as mdadm --force
// takes every device of the newest events counter: rebuilding one from stripes the failing
// write tore would make its chunks wrong (TestForceTwoTogether) —, gives them all one events
// counter, marks the array dirty and rebuilds
// the stale members (the first to fail: it missed the writes taken degraded) as fresh spares;
// the resync that follows a dirty assembly then fixes the stripes being written at the
// failure (with the journal policy, the replay does). The WARN log line "FORCED assembly"
// names every member trusted, forced and rebuilt, with its events counter, and why. Never
// trusted: a member that failed alone while the array had every role, one whose role another member holds or
// is being rebuilt into. Without Force, Assemble refuses with ErrNeedsForce (and
// ErrTooManyMissing), saying what Force would do; Force with ReadOnly writes nothing.
// Trusting the first member to fail instead, as "XOR every member and recompute parity"
// would, loses what was written degraded (TestForceAssemble fails so).
//
// The write-intent bitmap is the same on every member of a role: bit r (byte r/8, bit r%8,
// least significant first) set means stripes [r×R, (r+1)×R) — R the region in stripes — may
// have been written since their parity was last known to match, so a crash may have left
// them inconsistent. Bits past the last region are zero (anything else makes the bitmap
// unreadable). Assembly ORs the members' bitmaps. A page written while the power fails may
// hold old and new bits, each sector one or the other: harmless, since a bit being set there
// guards a write not yet issued, and a bit being cleared a region already synced. Arrays
// created before the bitmap (feature flag 0, fields 0) assemble as before, without one; the
// flag is never added to an existing array. A build from before the bitmap refuses a
// superblock with the flag (unknown feature), which is what it should do.
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
// Writes go through a write-back stripe cache (package stripe/cache; IOOptions.StripeCache
// sets its capacity in stripes, default DefaultCacheStripes: 64 MiB worth, 16 to 256 stripes;
// its memory is stripes × members × chunk bytes, allocated as stripes are first cached):
//
//   - A write that covers a whole stripe is written at once, with parity computed from the new
//     data alone and no member reads (counted as FullStripeWrites).
//   - Anything else lands in the stripe's cache head as dirty 4 KiB units and WriteAt returns.
//     Background goroutines (IOOptions.WriteBackers, default 4, 128 with remote members;
//     stripes in parallel) write a
//     head out once no write has reached it for IOOptions.WriteBackDelay (default 5 ms, at most
//     8 delays after its first write), at once when every unit is dirty (a full-stripe
//     write), and oldest first once more than half the cache is dirty, until 3/8 is; a head all up to date
//     but only partly dirty waits like any partial one, so that later writes join it. A partial head is written by
//     read-modify-write or reconstruct-write, whichever reads fewer units; in a
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
// (TestHazard shows how). StripeCache < 0 disables write-back caching: the cache has no heads,
// so every partial write is written through, with its parity, before it returns, and whole
// stripes as always (the cache is the only write path).
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
// stripes, a rebuild, scrub or resync batch, and the cache's batch of whole stripes hold several
// at once, taken in ascending table order (LockSpan), and the cache takes another
// stripe's lock only with TryLock (to evict it), so nothing can deadlock.
// Reads take a stripe's lock only while they copy from its cache head. Like io.ReaderAt on a
// file, a read that overlaps a concurrent write may see old or new bytes, but never
// parity-related garbage, since the bytes read are the member's own data. The member reads of
// one request run concurrently, each member's share on an idle read worker or the calling
// goroutine, its ranges that are contiguous on the member in one preadv; the member reads and
// writes within one stripe run concurrently too (on per-member I/O goroutines),
// and a run of whole stripes in one write is written with one pwritev per member.
//
// Background goroutines — the cache's write-out goroutines, ioWorkers per role for its
// member I/O and readWorkers per role for reads across members (not for read-only arrays),
// the rebuild or scrub, the member watchdog (with a member timeout), and
// the cache's Unpin after a failure — are started by Create and Assemble (a rebuild also by a
// failure or AddSpare) and stopped, and waited for, by Close. Superblock updates, syncs and
// bitmap flushes start a goroutine per member that ends with its system call (eachMember).
// Member reads run in the goroutine that needs them, or a read worker (without read workers, a
// request touching several members starts one goroutine per extra member).
//
// The main locks, outermost first: opMu (the methods read-lock it, Close write-locks it), mgmtMu
// (management), a stripe lock or several (above), sbMu (superblock updates and membership),
// syncMu (the background job); each is commented in array.go with what it guards. Marking a
// member faulty takes sbMu under a stripe lock, so nothing holding sbMu (or syncMu) ever waits
// for a stripe lock, and a failure only cancels a running rebuild or scrub, never waits for
// it. The role table (roles.go) is read without a lock on every I/O; its changes are made
// under sbMu. Close waits for the calls in flight and makes later calls fail with ErrClosed.
//
// WriteAt does not keep p after it returns (with stable pages on, p must not change during the
// call). WritePinned may keep p until it calls release.
//
// # Failure and rebuild
//
// Member I/O asks the role table per stripe which members are usable (memberIO for one op;
// memberWritev for a batch's vectored writes, readRole for a read's). A read that fails is
// counted in the member's ReadErrors and served as the XOR of the other members' bytes at the
// same offsets, under the stripe lock; a read that succeeds but takes longer than
// IOOptions.MemberTimeout (default 30 s) is counted the same way (ErrTimeout in the log) and
// its data is used. A member's read is full or an error: a short one — the end
// of a file truncated under the array, before the size it had at assembly — is ErrShortRead,
// a read error like EIO, on every path (pread, preadv, copies from and replies sent from the
// mappings, rebuild and scrub, which stop at it), never zeroes; a write that grew such a file
// (pwrite extends a file, leaving a hole of zeroes) fails with ErrMemberShrunk, and so the
// member (member.File checks after each write that the file still reaches its last page); a
// flush fails a member that has shrunk (ErrMemberShrunk) even if nothing met its new end. Past IOOptions.ReadErrorLimit (default 20) errors the
// member is marked faulty. A write that fails (or an fdatasync, or a trim) marks the
// member faulty at once. Marking faulty sets the member's flag and, under sbMu, rewrites every
// other working member's superblock with the role marked faulty in the state table and the
// events counter bumped, synced, before the failing I/O returns; any write that skipped the
// member meanwhile waits for that record (awaitRecord) before it is acknowledged. The write
// itself then completes degraded: every other member of the stripe was written with parity
// that includes the new data, so the stripe is consistent without the failed member (its chunk
// is what parity implies). Cache write-outs behave the same way, so nothing stays dirty
// forever. With a second role lost the array is failed: reads of chunks on the lost members
// return ErrArrayFailed (EIO, never a guess), other chunks are still read from their members,
// and every write returns ErrArrayFailed without touching any member. A role being rebuilt
// counts as lost above the rebuild position, so a second loss during a rebuild fails the array
// too. The role table (roles.go) answers every such question — which roles are usable,
// missing or lost in a stripe, whether the array has failed — for the I/O paths, Status
// (StateFailed), Close (which never marks a failed array clean) and Fail and Replace, which
// refuse to fail the array (ErrWouldFail) unless given Force.
//
// The failure itself is decided in one place, the role table's recount, and enforced by one
// gate (gate.go), which the role table holds: every write of member data (client writes, cache
// write-outs, trims, rebuild and scrub writes, the bitmap) enters the gate for its system call
// and leaves as soon as it returns. recount shuts the gate when the array fails; the fail that
// did it, and every write that reports ErrArrayFailed, first waits for the writes still inside
// on working members (drain). So when a client learns of the failure, the survivors hold what they will hold from then on,
// which is what Force assembles from. A failed array also gives back the caller buffers its
// cache held by reference (releasePins: Cache.Unpin copies them first), so the NBD server can
// end its connections, and Close reports what the cache could not write out in one error.
//
// A member that stops answering is failed after IOOptions.MemberTimeout (hung.go): each
// member's writes are counted (begin/end: under way and completed, no clock read), and a
// watchdog that looks at the counts every eighth of the timeout fails a member that has had
// writes under way with none completing for the timeout (ErrMemberHung), at most a quarter of
// it late; its ticks are also the clock that times member reads. Superblock updates, syncs
// and bitmap flushes run on all members at once and are bounded the same way (eachMember): a
// member that does not finish in time, or is marked faulty meanwhile, is left behind and
// failed. fail marks the member faulty before it takes sbMu, and Status answers from a snapshot
// (SuperblocksBusy) when sbMu is held past statusWait, so neither status nor `fail` of the hung
// member waits for it. A system call is never cancelled: the request inside one waits for it.
//
// Spares carry a superblock with role -1 and the array's UUID (CreateOptions.Spares, AddSpare)
// and are found by Assemble. When a role has no working member and a spare is idle, a rebuild
// starts by itself: one background goroutine (started by the array, cancelled and waited for
// by Close) that takes the spare into the role as "rebuilding" and walks the stripes in
// batches of up to 1 MiB per member, each batch under its stripes' locks (LockSpan): it first
// writes out the batch's dirty cache heads (so the members hold the latest data), reads the
// other members, XORs them onto the spare, and only then moves the rebuild position past the
// batch, still under the locks. Below the position the spare is a member like any other (reads
// from it, writes to it); at and above it the role counts as missing (reads rebuild, writes
// leave it out). The position is checkpointed — spare fdatasync'ed, then every superblock
// updated — every second and when the rebuild stops, so the next assembly resumes there
// (Progress.Resumed); the member being rebuilt says so in its superblock (role, table state 2).
// A superblock update records only the position the spare was synced to. Between the
// checkpoint and the position the spare is served but not recorded: a write there, torn by a
// crash, would make the restart rebuild the spare's chunks of its stripe (flushed ones too)
// from the torn stripe. So every path that writes a member checks, under its stripes' locks
// and before its first write, whether they reach into that window (roleTable.unrecorded), and
// records the position first (recordBefore: sync the spare, write the superblocks; writers
// that meet it at once share one record); the placed paths decline there instead.
// At the end the spare becomes active and the faulty member it replaced is dropped.
//
// ReAdd (mdadm --re-add, readd.go) brings back a member that failed, was removed or was
// missing at assembly, with its superblock intact, without a full rebuild. While a role has no
// active member (missing, faulty or being rebuilt) the write-intent bitmap clears no bit: its
// cleaner and Close's ClearAll ask bitmapMembers.Whole, before and after the sync that precedes
// a clear, and an array assembled degraded keeps the bits it reads back (Bitmap.Keep). Every
// superblock update written with every role active sets the cleared mark (EventsCleared, md's
// events_cleared) to its events counter. A member whose events counter is at least the mark
// left after the last update that could precede a clear, so every region written since it
// stopped receiving writes still has its bit. ReAdd checks the array UUID, that the member's
// role has no working member, that the member was not itself being rebuilt, and its events
// against the mark (ErrCannotReAdd otherwise; AddSpare rebuilds fully), and, holding every
// stripe's lock (so no write that left the member out is under way), takes the regions whose
// bits are set as the member's map (readdmap.go): it is whole everywhere else, and served
// (read, and written with the others) there at once. The map goes into the superblocks
// (featureReAdd) before any write reaches the member. The rebuild then resyncs the map's
// pieces, up to readdWindow at once, each under its stripes' locks: rebuilt from the others,
// the member synced, the piece marked whole and the map written again before the locks go. So
// the member is served exactly where the superblocks say it is whole, and a re-add stopped by
// Close or a crash resumes at the next assembly as a re-add, from its record: a stripe torn by
// a write at a crash, where the member is served, is made whole from the member's data by the
// resync, never rebuilt into it from torn parity. Progress.ReAdd and Resynced report it.
//
// AutoReAdd (autoreadd.go) runs ReAdd by itself for remote members (SpecPath ""): an away one
// — faulty, not by Fail or Replace, in a role with no working member; or given at assembly and
// not in the array — is opened again with backoff, and ReAdd's checks decide. A refusal
// (ErrCannotReAdd) is logged and ends its probes: the array never rebuilds a member in full on
// its own. Status.AutoReAdd lists the members it probes.
//
// A member that makes its own connections (memberpkg.Rechecker: a remote member, its several
// connections and its reconnections) is given, once its export carries its superblock
// (checkConns, recheck.go: at assembly as soon as it is read, after Create, AddSpare and
// ReAdd have written it), the check every other connection must pass before it is used: the
// export's superblock must be this member's (the array's UUID and the member's device UUID).
// Another array's member (ErrForeignMember), another member of this array (ErrOtherMember) or
// no valid superblock fails the member, so neither a server that came back with another disk
// behind the same URI nor one that routes the member's connections to different disks is read
// as the member; at assembly the array is refused with the member's error.
//
// Speed is bounded like md's sync_speed_min/max (IOOptions.SyncSpeedMin/Max, SetSyncSpeed;
// defaults 1 MiB/s and 200 MiB/s): after each batch the sync sleeps as long as it takes to stay
// under max, or under min if any client request arrived since the previous batch — so between
// the two it yields to client I/O. Progress (done, total, speed, ETA) is in Status().Sync and
// logged every five seconds; Status().LastRebuild and LastScrub keep the last run's.
//
// StartScrub walks the stripes the same way (cache heads written out first, stripe locks
// held), compares each stripe's parity with the XOR of its data, counts and records the
// mismatching stripes (the first 100), and with repair rewrites their parity from the data (as
// md's repair, it trusts the data). It needs every member (ErrDegraded otherwise); a member
// failure cancels it, and a rebuild or scrub already running makes it return ErrBusy.
//
// # Crash consistency
//
// An array that was not shut down cleanly (its superblocks still say dirty) may have stripes
// whose parity does not match their data: a crash between a stripe's member writes leaves some
// of them done. Assembly therefore resyncs: a background job (Status().Sync, Kind "resync";
// LastResync when it ends) recomputes parity from the data of every stripe that may be
// inconsistent, batch by batch under the stripes' locks (dirty cache heads written out first),
// at the sync speed limits, while the array serves. Reads are correct meanwhile, since on a
// whole array data chunks are read from their members and parity is not used. A partial write
// to a stripe the resync has not reached reconstructs its parity from the data
// (reconstruct-write), never read-modify-writes it: that would carry the stale parity forward.
// When the resync ends the array counts as clean again, and Close marks it so; until then it
// stays dirty on disk.
//
// Which stripes: with the write-intent bitmap (the default; CreateOptions.BitmapRegion sets the
// region size, default the smallest power-of-two number of stripes that needs at most
// DefaultBitmapBits = 4096 bits and covers at least DefaultBitmapMinRegion = 4 MiB: a write to
// a region whose bit is clear waits for a bitmap write, and smaller regions made a sequential
// writer wait every few stripes), only the regions whose bits are set; without a bitmap, or
// when it cannot be read, all of them. The bitmap is also the resync's checkpoint: a region's
// bit is cleared only after its parity was rewritten and the members synced, so a crash during
// the resync resumes with the regions left. A full resync (no bitmap) is checkpointed only by
// a clean stop, as md's resync_offset: Close, after writing everything out and syncing,
// records in the superblocks (still dirty) how far it got, and the next assembly resumes there
// (Progress.Resumed). Assembly clears the point from the superblocks, durably, before the
// array takes a write, so a crash during the resumed resync starts it over from stripe 0: the
// writes since the point was recorded may have been torn below it as well as above, and
// nothing records where they went. A build from before the point sees only "dirty" and
// resyncs everything.
//
// The bitmap's rules. A stripe write (a cache write-out or full-stripe write, a trim of whole
// stripes, a repair's parity write) first sets its region's bit in memory and waits until the
// bit is durable on every member of a role — written with pwritev2(RWF_DSYNC) where the member
// supports it, else a write and a Sync — before it issues any member write; it then counts as
// in flight until its last member write has completed. Only changed 4 KiB pages are written,
// and writers waiting for bits share one bitmap write (a group commit), so concurrent first
// writes to many regions cost one write per member. Bits are cleared lazily: once a second,
// for regions with no write in flight and none begun for BitmapClearDelay (3 s), the members
// are synced and, if no write began meanwhile, the bits cleared and written; a region written
// again soon after keeps its bit and costs nothing. Close clears every bit after the final
// sync. So a region costs one bitmap write per member when it is first written after an idle
// spell, a synchronous write on a disk, and a resync after a crash reads and writes only the
// regions that were being written (the README's "Crashes" gives the measured cost, with its
// commands).
//
// What the bitmap does not cover: the write hole. If the array crashes while degraded (or is
// assembled dirty with a member missing), the stripes written at the crash cannot be resynced —
// the missing chunk is known only through parity — and if a data chunk reached its member but
// the parity did not, the missing member's chunk, which nobody wrote, is now computed from
// mismatched parity and reads wrong; a rebuild writes that wrong chunk onto the new member.
// So Assemble refuses a dirty array with a role that has no member, when regions are pending
// (ErrDirtyDegraded, a *DirtyDegradedError naming the role and the regions at risk; nothing is
// written, so the member can still come back), as md refuses to start a dirty degraded array;
// Force assembles it anyway and ReadOnly to look at it (TestDirtyDegradedRefused). A role
// being rebuilt onto a spare at the crash resumes its rebuild instead. Assembled so — or
// crashed while serving degraded and not reassembled since — raid5d logs the hole as an
// error and reports Status.WriteHole; it keeps serving (TestWriteHole shows the corruption).
//
// Remote members come late after a power cut of a rack: Assemble opens every member at once,
// and with AssembleOptions.WaitRemote tries a remote one that does not answer yet again, with
// a backoff, until it answers, the wait has passed, or the members that answered hold every
// role a late one could take (TestWaitRemoteLate, TestWaitRemoteNever,
// TestWaitRemoteFaultyRole).
//
// The write journal closes the hole (CreateOptions.Consistency "journal", with a journal file
// or device: CreateOptions.Journal or JournalPath; create --consistency journal --journal
// FILE). Like md's raid5 journal it is a separate device holding a ring of records (layout
// above). Every stripe operation — a cache write-out or full-stripe write, a trim of whole
// stripes, a repair's parity write — hands writeIntent the exact member writes it will issue;
// the journal appends one record with all of them (trims as descriptors without payload) and
// returns only once the record is durable, and only then are the member writes issued.
// Concurrent writers share one pwritev and one fdatasync of the journal (a group commit: the
// first writer to find no write in progress writes every record queued so far). A record's
// space is reclaimed by a checkpoint: it waits until the member writes of every record logged
// so far have completed, fdatasyncs the members, and writes the header with the tail moved
// past them. A background goroutine checkpoints whenever the ring is more than half full; a
// writer that finds it full checkpoints itself — that waits only for member writes already
// issued, never for a stripe lock, so a cache write-out that holds its stripe's lock while it
// waits cannot deadlock — and nothing is overwritten before the tail has moved past it.
//
// Assembling a dirty array with a journal replays it instead of resyncing: from the tail,
// record by record, while the checksums, the array UUID, the position and the sequence number
// (one more than the last) are right, every op is rewritten to the member holding its role
// (a missing or faulty role is skipped: the record's parity already accounts for it); then
// the members are synced and the journal emptied. A torn record ends the journal (its writes
// were never issued: they waited for it), and a record of an earlier lap has the wrong
// sequence number; the sequence numbers after a replay skip ahead by more than the ring holds,
// so a whole record left past a torn one can never pass for a later one.
//
// A record damaged after it was made durable must not end the replay quietly: the records
// after it may have written their stripes already, and replaying the older records before it
// over those stripes would undo flushed writes. Before it writes anything the replay reads
// the rest of the ring, every page, for a valid record (header checksum, UUID, position)
// whose commit point is above the damaged record's number. Each group commit seals its
// records with that point (the group's first number: everything before it is durable), so
// such a record proves the damaged one had been synced: Assemble then refuses with
// ErrJournalCorrupt, naming both positions and numbers, and writes nothing
// (TestJournalCorruptNoRollback; a torn group, whose later records carry its own commit
// point, still ends quietly: TestJournalTornGroup). AssembleOptions.SkipCorruptJournal (serve
// --skip-corrupt-journal) is the way forward, as mdadm's --force is: it replays none of the
// records, discards them (the tail moves a whole lap ahead, so none can pass again), and
// recomputes all parity from the members' data chunks, trusted as they are (a full resync,
// Status.Unclean until it ends). What it keeps: every write flushed before the crash, since a
// flush syncs the members; what it may lose: writes not flushed, or in flight, at the crash,
// which NBD allows. Until that resync has finished the journal's header flags it, so a crash
// during it resyncs again after the replay (TestJournalSkipCorrupt). Degraded, the stripes
// being written at the crash are the write hole (Status.WriteHole), as without a journal.
//
// Replaying completes
// every stripe operation that may have been interrupted, atomically, with the bytes it was
// writing, so parity matches data everywhere, whole or degraded, with no resync and no write
// hole (TestWriteHoleJournal, TestJournalDegradedPowerCut, TestPowerCut's journal cases).
// Nothing else writes a stripe (a rebuild writes only the spare, below its own checkpoint),
// so nothing else can be inconsistent. A journaled array has no bitmap: it would add a
// synchronous write per region for nothing, since no resync follows a crash.
//
// A journal on a member's own storage is refused by Create and Assemble, before anything is
// written (ErrJournalOnMember, naming both): the same file as a member or spare (same device
// and inode: another path, a hard link), the same block device (same device number through
// another node), or a file on a filesystem of a member device (its st_dev is the member's
// rdev), or the reverse. A journal file on the members' filesystem is legal (the tests put
// everything on /dev/shm); JournalSharesFilesystem finds it, and create warns. The journal may
// be a member spec (below): volatile:PATH makes a power-cut test of the journal itself. Create
// makes PATH if absent and records the spec with PATH absolute (MapSpecPath), so every
// assembly opens it the same way (TestJournalVolatileSpec).
//
// Without its journal a dirty journaled array is refused (ErrJournalMissing, naming the path;
// AssembleOptions.JournalPath or serve --journal point elsewhere); a journal of another array
// or with a corrupt header, or with records of format version 1 to replay, is refused with
// ErrJournal; either way before anything is written.
// A clean one (Close checkpoints the journal, so it is empty) is assembled read-only, since
// its writes could not be journaled. If writing the journal fails, writes fail (the error is
// sticky until the array is reassembled): a journaled array never writes a stripe unlogged.
//
// The journal is not the default: every byte written is written twice (plus a 4 KiB header
// per record: a 4 KiB read-modify-write logs 12 KiB), and every group of writes waits for a
// journal fdatasync (BenchmarkConsistency compares the policies; figures in the README's
// "Crashes"). On disks the journal's fdatasyncs cost more, and it belongs on a fast device of
// its own. The bitmap (the default) costs little and shortens the resync after a crash to what
// was being written; choose the journal when a crash while degraded must not corrupt
// anything. "ppl" is refused with ErrConsistency.
//
// Writes not yet flushed may be lost in a crash, as NBD allows; a 4 KiB block written whole
// holds its old or new contents, never a mix (TestPowerCut checks this with raidtest.Volatile
// members that lose, or keep a random subset of, their unsynced pages at once).
//
// # Exclusive use
//
// A member, spare or journal is used by one array at a time. OpenMember (and so Create,
// Assemble, AddSpare and the journal's open) holds a flock(2) lock on the file or device node
// until Close: exclusive for a read-write open, shared for a read-only one, so read-only
// assemblies may share members but not with a writer. A block device opened read-write is also
// opened with O_EXCL, the kernel's exclusive claim (as md and mkfs take it), which fails while
// the device is mounted, part of md or dm, or claimed by another program. Anything in use is
// refused with ErrMemberBusy in a *BusyError naming the holder: the processes holding the lock
// (from /proc/locks: flock records the pid that took it, where OFD locks report -1 and POSIX
// record locks, being per process, would neither conflict within one process nor survive the
// close of another descriptor of the file), or the device's mount point or md/dm holder. Two
// opens in one process conflict too. Nothing is written before the lock is held; Force does not
// override it. Examine takes no lock: it reads the superblocks of members a daemon is using.
// The lock is advisory: it keeps raid5d from raid5d (and from tools that honour flock, such
// as udev), not cp or dd from member files. Files Create makes (members, spares, the journal)
// are mode 0600.
//
// # Testing with faulty members
//
// Member specs other than plain paths are kinds registered with the member package
// (raid/member # Kinds); the raid package knows none. cmd/raid5d registers
// raid/member/faulty's faulty:PATH?key=value&... and volatile:PATH?... (fault injection and
// a volatile write cache; keys in that package's doc), and OpenMember — and so Create,
// Assemble, AddSpare, a journal path and the command line — then accepts them, locked like
// PATH itself (# Exclusive use). Their Name is PATH (SpecPath finds it, MapSpecPath rewrites
// it). In-process tests use raidtest.Faulty, the same implementation, which also counts
// operations.
//
// # Errors
//
// The sentinel errors are gathered in errors.go, grouped by phase, each with a comment saying
// which methods return it; test for them with errors.Is, never by message. An error that a
// member is to blame for comes in a *MemberError (errors.As) naming the member, its role, the
// operation and the member offset. The errors of the I/O methods carry the errno an NBD server
// replies with (an Errno() uint32 method; EIO where none is found):
//
//   - the request itself: ErrOutOfRange (EINVAL), ErrReadOnly (EPERM), ErrClosed (ESHUTDOWN);
//   - the array: ErrArrayFailed (EIO), from every write, Flush and WriteAtFUA of an array that
//     has lost two roles, and from reads of the data those roles held;
//   - a member, inside a *MemberError: ErrShortRead, ErrMemberShrunk and ErrMemberHung, which
//     the I/O methods return only once the array has failed (until then the member is failed,
//     or its data rebuilt, and the request succeeds), and ErrTimeout, which is only logged.
//
// The management methods return ErrBusy, ErrNoSuchMember, ErrNotFaulty, ErrDegraded,
// ErrWouldFail, ErrCannotReAdd, ErrNotRunning and ErrBadSpeed, with errnos too. A reconnected
// remote member's recheck fails it with ErrForeignMember or ErrOtherMember inside the member's
// own error (# Failure and rebuild). Create, Assemble and Examine
// return the superblock errors (ErrBadSuperblock, matched by ErrBadMagic, ErrChecksum and
// ErrVersion), the membership errors (ErrForeignMember, ErrDuplicateRole, ErrDuplicateMember,
// ErrStaleMember, ErrTooManyMissing, ErrNeedsForce, ErrGeometry, ErrMemberTooSmall, ErrInUse,
// ErrNoMembers, ErrMemberBusy in a *BusyError naming the holder), and those of the consistency
// policy (ErrConsistency, ErrBitmapRegion, ErrJournal, ErrJournalCorrupt, ErrJournalMissing,
// ErrJournalOnMember).
//
// # Caveats
//
//   - Without the journal policy (the bitmap, the default, or none) a crash while degraded can
//     corrupt chunks that were not being written (the write hole, Status.WriteHole; see
//     # Crash consistency); the journal closes it at the cost of writing every byte twice. No
//     partial parity log (md's PPL). Writes not yet flushed may be lost in a crash, as NBD
//     allows: they may still be in the stripe cache.
//   - A full resync (no bitmap) resumes only after a clean stop: after a crash it starts over;
//     the bitmap is not added to arrays created without it. A spare that takes a role gets the bitmap at the next bitmap write.
//   - The bitmap's fdatasync fallback (members without RWF_DSYNC, such as faulty: specs)
//     syncs the whole member, which flushes its data writes too.
//   - No member I/O can be cancelled. Writes have no timeout: a member that hangs in a write
//     hangs that stripe. A read is issued straight into the caller's buffer in the caller's
//     goroutine, so a member that hangs in a read holds that request until the system call
//     returns; only then is the read counted as slow (MemberTimeout) and, past the read-error
//     limit, the member failed. A hung member is thus failed only once its reads come back
//     (the kernel's own device timeouts bound that for block devices). The earlier design,
//     which gave up on a read at the timeout and rebuilt its data, needed a goroutine hand-off
//     and a bounce-buffer copy per read, which cost more than an in-memory 4 KiB read itself.
//   - Read errors are not repaired by rewriting the sector from the rebuilt data (md does);
//     the member is failed at the read-error limit. No bad-block list.
//   - Replace is the simple version: the member is failed first and the array runs degraded
//     until the rebuild onto the new spare ends.
//   - A source read error during a rebuild (a second failure) stops the rebuild; the array
//     stays degraded with the spare partly rebuilt (resumed from the checkpoint next time).
//   - While clients are busy, a sync runs at its minimum speed (md yields a little less
//     strictly: it checks its own in-flight I/O); idle, at its maximum.
//   - A faulty member stays open until Close (I/O in flight may still use it), even after
//     Remove or a finished rebuild drops it from the array. Added again under the same path
//     (AddSpare after Remove), its open file is reused. A data write still in flight from
//     before its failure (a hung member) holds its stripe's lock, so the rebuild waits for it
//     there and it cannot land over rebuilt data; a member write deadline that let the caller
//     go (and the lock) while the system call goes on would have to make AddSpare wait for
//     that member's writes instead. A bitmap page write in flight at the failure may land
//     afterwards on the re-added member's copy of the bitmap.
//   - In a failed array, dirty cached data that cannot be written out stays in the cache
//     (readable) until Close, and is then lost.
//   - A crash in the middle of a superblock update can leave members one event apart; the one
//     behind is accepted if the others still call it working, else left out as stale.
//   - A forced assembly (Force) rebuilds the first member to fail from the others while the
//     array is dirty: stripes being written when the array failed may be torn, and that
//     member's chunks rebuilt from them may be wrong (the write hole; Status.WriteHole). A
//     rebuild writes every chunk, holes included, so a sparse member grows to its full size.
//   - The counters are plain atomics shared by all goroutines, not sharded.
//   - A journal record damaged after it was synced is told from a record torn by the crash
//     only by a later group's record (# Crash consistency). A damaged record in the last
//     group written, or one after which every later record is damaged too, ends the replay
//     quietly, as a torn record does: the records before it are replayed, and a stripe that
//     it (or a later record of its group) wrote after them goes back to their data.
//     The replay of a dirty array reads the whole ring once more to look for such records.
package raid
