package raid

import (
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// IOOptions configure how an array does I/O: the stripe cache and the stable-pages promise.
// They are part of CreateOptions and AssembleOptions; the zero value is a valid default (a
// write-back stripe cache of DefaultCacheStripes-sized capacity, buffers copied).
type IOOptions struct {
	// StablePages declares that no buffer handed to WriteAt changes until the call returns, and
	// none handed to WritePinned until its release runs. Whole-stripe writes then compute parity
	// and write the members straight from the caller's buffer (no copy), and WritePinned keeps
	// references to whole aligned 4 KiB units of its buffer in the cache instead of copying
	// them. Off (the default), every write is copied into the cache first, as md does without
	// skip_copy: a caller that changes its buffer during a write cannot make parity disagree
	// with the data. Turn it on only when the caller keeps the promise (the nbd server does).
	StablePages bool
	// MappedReads reads member files and block devices through read-only memory mappings of
	// them (see mapped.go): member reads of up to MappedCopyMax bytes copy from the mapping
	// instead of calling pread, and ReadMapped hands out slices of it for large reads. A
	// member's read error then arrives as a fault, which is caught and answered by a pread, so
	// errors are handled as without it. The process's resident memory counts the file pages
	// it has read through the mappings. Members opened with O_DIRECT (member.SetDirect) have
	// no mapping and are read with pread.
	MappedReads bool
	// MappedWrites lets the caller place writes of whole stripes (PlaceWrite, placed.go): read
	// their payload straight into writable memory mappings of the member files where every
	// page is in the page cache, the parity XORed from there. Every other member write is a
	// pwrite (and every write to a member opened with O_DIRECT, which has no mapping): a copy
	// in user space into a mapping could be cut anywhere by the daemon's death, tearing a
	// 4 KiB unit, which pwrite (it copies page by page) never does.
	MappedWrites bool
	// StripeCache is the stripe cache's capacity in stripes: > 0 that many; 0 the default
	// (DefaultCacheStripes); < 0 no write-back caching: every write is written to the members
	// with its parity before WriteAt returns (a partial one by read-modify-write or
	// reconstruct-write, through the cache's write-through path: the cache has no heads). The
	// cache's memory is StripeCache × members × chunk bytes, allocated as stripes are first
	// cached.
	StripeCache int
	// StripeCacheBytes, if > 0, sets the capacity in bytes instead (serve --stripe-cache
	// SIZE): as many stripes as fit, members × chunk bytes each, at least one. The geometry is
	// the array's own, so no caller has to read it from the members first.
	StripeCacheBytes int64
	// WriteBackDelay is how long a partly written stripe waits in the cache for more writes
	// before it is written out; 0 means cache.DefaultWriteBackDelay (5 ms).
	WriteBackDelay time.Duration
	// WriteBackers is the number of background write-out goroutines; 0 means
	// cache.DefaultWriteBackers (4), or 128 when a member waits for a network (member.IsWaiter:
	// a remote member), whose write-outs are round trips rather than copies.
	WriteBackers int
	// MemberTimeout is the deadline of a member's I/O. A member that has had writes under way
	// (data, trims, syncs, the bitmap, superblocks) with none completing for this long is
	// failed (ErrMemberHung, by a watchdog), and so is one whose superblock update or sync
	// does not complete in this time: the array goes on degraded. A member read that succeeds
	// but takes longer counts as a read error (towards ReadErrorLimit; its data is still
	// used). A system call is never interrupted: a request whose own member I/O hangs waits
	// for it. 0 means DefaultMemberTimeout (30 s); < 0 none.
	MemberTimeout time.Duration
	// ReadErrorLimit is how many read errors a member may have before it is marked faulty;
	// 0 means DefaultReadErrorLimit (20).
	ReadErrorLimit int
	// SyncSpeedMin and SyncSpeedMax bound rebuild and scrub speed in bytes/s, like md's
	// sync_speed_min/max: a sync runs up to max while clients are idle and slows to min while
	// they do I/O. 0 means DefaultSyncSpeedMin (1 MB/s) and DefaultSyncSpeedMax (200 MB/s).
	SyncSpeedMin, SyncSpeedMax int64
}

// Default cache sizing: DefaultCacheBytes worth of stripes, at least MinDefaultCacheStripes and
// at most MaxDefaultCacheStripes. With 4 members and 64 KiB chunks that is 256 stripes, 64 MiB,
// holding 48 MiB of partial stripes: far more than a client's queue of small sequential writes
// needs to fill its stripes before they are written out.
const (
	DefaultCacheBytes      = 64 << 20
	MinDefaultCacheStripes = 16
	MaxDefaultCacheStripes = 256
)

// DefaultCacheStripes returns the capacity StripeCache 0 gives an array of layout l.
func DefaultCacheStripes(l stripe.Layout) int {
	n := DefaultCacheBytes / (int64(l.Members()) * l.ChunkSize())
	return int(min(max(n, MinDefaultCacheStripes), MaxDefaultCacheStripes))
}

// Counters are an array's cumulative I/O counters (see Array.Counters).
type Counters struct {
	FullStripeWrites   uint64 // stripes written whole, parity from the new data alone: no reads
	RMWWrites          uint64 // partial-stripe writes (write-outs) by read-modify-write
	RCWWrites          uint64 // partial-stripe writes (write-outs) by reconstruct-write
	MemberBytesRead    uint64 // data-area bytes read from members (superblocks not counted)
	MemberBytesWritten uint64 // data-area bytes written to members
	MappedBytesRead    uint64 // of MemberBytesRead, bytes handed out from the members' mappings (ReadMapped)
	MappedBytesWritten uint64 // of MemberBytesWritten, bytes written through the members' mappings (placed writes: data and parity)
	PlacedBytes        uint64 // bytes of placed writes (PlaceWrite): read by the caller straight into the members' mappings
	CopiedBytes        uint64 // bytes of writes copied into the stripe cache
	CacheHits          uint64 // read pieces (one chunk's worth at most) served from the cache alone
	CacheMisses        uint64 // read pieces that needed member reads
	CacheEvictions     uint64 // clean cached stripes dropped to make room
	WriteThroughs      uint64 // partial writes written synchronously because the cache was full of dirty stripes (every one, with StripeCache < 0)
	CacheStripes       int    // the cache's capacity in stripes, 0 without write-back caching
}

// counters are the array's own counters; the cache keeps the rest.
type counters struct {
	memberRead, memberWrit atomic.Uint64
	mappedRead             atomic.Uint64 // of memberRead, through ReadMapped
	mappedWrit             atomic.Uint64 // of memberWrit, through the mappings (MappedWrites)
	placed                 atomic.Uint64 // client bytes of complete placed writes
	rmw                    atomic.Uint64 // placed read-modify-writes (rmw.go)
}

// Counters returns the array's cumulative I/O counters. It may be called concurrently with I/O.
func (a *Array) Counters() Counters {
	c := Counters{
		MemberBytesRead:    a.ctr.memberRead.Load(),
		MemberBytesWritten: a.ctr.memberWrit.Load(),
		MappedBytesRead:    a.ctr.mappedRead.Load(),
		MappedBytesWritten: a.ctr.mappedWrit.Load(),
		PlacedBytes:        a.ctr.placed.Load(),
	}
	if a.cache != nil {
		cc := a.cache.Counters()
		c.FullStripeWrites, c.RMWWrites, c.RCWWrites = cc.FullStripeWrites, cc.RMWWrites+a.ctr.rmw.Load(), cc.RCWWrites
		c.CopiedBytes = cc.CopiedBytes
		c.CacheHits, c.CacheMisses, c.CacheEvictions = cc.Hits, cc.Misses, cc.Evictions
		c.WriteThroughs = cc.WriteThroughs
		c.CacheStripes = a.cache.Capacity()
	}
	return c
}
