package nbd

// Device is what the server exports: a fixed-size array of bytes. It knows nothing of RAID;
// raid.Array satisfies it, and so does an in-memory device in tests.
//
// The server calls these methods concurrently from many goroutines (requests on one connection
// are processed in parallel, and there may be many connections). Implementations must be safe
// for that. The server never passes a buffer shared with another request in flight, and never
// touches a buffer again until the call that was given it has returned.
type Device interface {
	// ReadAt and WriteAt follow io.ReaderAt and io.WriterAt: a short count comes with an error.
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Size is the device size in bytes. The server reads it once per connection.
	Size() (int64, error)
	// Flush makes every completed write durable (on every connection: the server advertises
	// CAN_MULTI_CONN on that promise).
	Flush() error
	// Trim tells the device a range is no longer needed; later reads may return old data or zeroes.
	Trim(off, length int64) error
	// WriteZeroes makes a range read back as zeroes. With noHole the device must allocate the
	// range rather than punch a hole.
	WriteZeroes(off, length int64, noHole bool) error
}

// FUAWriter is implemented by devices that can make one write durable more cheaply than
// WriteAt followed by Flush. The server uses it for writes that carry NBD_CMD_FLAG_FUA.
type FUAWriter interface {
	WriteAtFUA(p []byte, off int64) (int, error)
}

// PinnedWriter is implemented by devices that can keep a write's buffer after the call returns
// (zero-copy write-back under stable pages). The server calls WritePinned instead of WriteAt for
// writes without FUA when the export's StablePages option is on: p is pinned — page-aligned, never
// written by the server or anyone else, never reused for another request — until release is called.
// The device must call release exactly once, after its last read of p; it may call it before
// WritePinned returns (e.g. when it copied p or wrote it through), and it must call it even on error.
// release may be called from any goroutine; calling it twice panics. The reply to the client is
// sent when WritePinned returns, so the write must be complete in the WriteAt sense by then
// (later reads see it, a later Flush makes it durable) even while the device still reads p.
//
// A held buffer stays charged to its connection's Options.MaxInFlightBytes, and the server stops
// reading that connection's requests while they are at the bound, so the device must release
// its buffers on its own within bounded time (write-back timer, cache pressure), not wait for
// a later request such as a FLUSH that the server may not read until it does. A connection
// ends only when the device has released all of its buffers. See the package documentation,
// "Concurrency and buffer ownership".
type PinnedWriter interface {
	WritePinned(p []byte, off int64, release func()) (int, error)
}

// CachedWriter is implemented by devices that can take some short writes into memory of their
// own without waiting for anything (raid5d: whole 4 KiB units of a partial stripe, into its
// stripe cache, or in place into its members' page cache). The server's reader offers it each WRITE without FUA whose payload had already
// arrived when its header was read, once the payload is in the request's buffer, and answers
// what it takes itself, with the replies of the next requests if they have already arrived: no
// hand-off to a worker, and fewer reply writes.
//
// WriteCached writes p at off and reports true if it can do so without waiting (no I/O that
// waits for a device, no lock that another holds) and without error; the write is then complete in the WriteAt sense.
// With release nil, p is not kept after the call (WriteAt); with release non-nil (the export's
// StablePages), the device may keep p as WritePinned does, under the same contract, and calls
// release exactly once. Otherwise it reports false having done nothing (release is not called),
// and a worker writes p as usual (WriteAt, WritePinned), which reports any error. It is called
// from the connection's reader, concurrently with the other methods.
type CachedWriter interface {
	WriteCached(p []byte, off int64, release func()) bool
}

// WriteExpecter is implemented by devices that hold partial writes back for a while to join
// them with their neighbours (raid5d: its stripe cache's edge stripes, written out when the
// write-back delay runs out). The server's reader calls ExpectWrite with a WRITE's range once
// it has admitted the request (under the connection's in-flight bounds, its buffer taken),
// before it reads the payload and a worker writes it, so that the device can keep waiting for
// a write it knows is coming. Not before admission: a WRITE held at the bound waits for
// buffers the device may be keeping until it writes out what would wait for that WRITE. A
// hint: the WRITE may still fail, and the device must not wait for it unboundedly (nor for a
// placed WRITE, which is not announced). It is called from the connection's reader,
// concurrently with the other methods.
type WriteExpecter interface {
	ExpectWrite(off, length int64)
}

// PlacedWriter is implemented by devices that can take a WRITE's payload read straight into
// the memory where it will live (raid5d: its members' files mapped into memory), so that the
// kernel's copy out of the socket is the only copy. The server uses it, on connections without
// TLS, for WRITEs without FUA whose payload its buffered reader holds none of: it places a
// WRITE in pieces, each a range whose bytes have all arrived in the socket's receive queue, so
// that reading a piece never waits for the client, and only the kernel's copy (readv) writes
// the slices; what it cannot place it writes as usual.
//
// PlaceUnit is the device's unit of placement (raid5d: a stripe), a constant: the server offers
// only WRITEs that hold at least one whole unit (aligned to a multiple of it), and cuts them
// into pieces at multiples of it; a piece may be the WRITE's head before its first multiple,
// or its tail after the last, alone (the device declines what it cannot place). PlaceWrite appends to v the slices that take the n bytes at off, in
// order, and returns them with a handle and ok true; or ok false, having done nothing, and the
// server writes the piece, and the rest of the WRITE, as usual. The server then reads the
// piece's bytes into the slices and calls CommitPlaced exactly once, with the handle, the
// number of bytes it read, and whether the piece ends its WRITE (last): received is n, and the
// piece's result goes into the reply; or fewer, when the read failed (the connection then ends
// and the write is not acknowledged), and the device must leave the range consistent with
// whatever part arrived. The slices are not used after CommitPlaced.
type PlacedWriter interface {
	PlaceUnit() int64
	PlaceWrite(off int64, n int, v [][]byte) ([][]byte, any, bool)
	CommitPlaced(h any, received int, last bool) error
}

// PlacedProgresser is a PlacedWriter that works on a placed piece while its bytes are still
// being read (raid5d: each stripe's parity, while its data is in the CPU's cache): the server
// reads a long piece a step at a time and calls PlacedReceived after each step but the last
// with the handle and the bytes read into the piece's slices so far, from the goroutine that
// reads them, before CommitPlaced.
type PlacedProgresser interface {
	PlacedReceived(h any, received int)
}

// MappedReader is implemented by devices that can answer a read with slices of memory they
// already hold the bytes in (raid5d: its members' files mapped read-only), so that the reply is
// written from there rather than copied into the request buffer first. The server uses it for
// READs when the export's MappedReads option is on and the connection is not encrypted.
//
// ReadMapped appends to v slices that together hold, in order, the len(p) bytes at off, and
// returns them with ok true; it may read some of the bytes into p (the request buffer, which
// the slices may then point into). The server only hands the slices to the kernel (the reply's
// writev) and never reads or writes them in user space, and calls ReleaseMapped exactly once
// per successful ReadMapped, from any goroutine, after the reply is written or abandoned —
// which may be a reply-timeout later. With ok false (v unchanged, nothing to release) the
// server reads with ReadAt instead: that is the answer for any error, so that ReadAt reports it.
type MappedReader interface {
	ReadMapped(p []byte, off int64, v [][]byte) ([][]byte, bool)
	ReleaseMapped()
}

// BlockStatuser is implemented by devices that know which of their ranges are holes: ranges
// that certainly read as zeroes and are not allocated in the backing storage. The server
// answers NBD_CMD_BLOCK_STATUS for the base:allocation metadata context with it; a device
// without it has every range reported as allocated data (flags 0), which is always true.
//
// BlockStatus describes the consecutive ranges from off on, appending them to dst[:0] and
// returning the result: each Extent has a positive Length, and together they cover at least
// one byte and at most length bytes of [off, off+length). It may stop early, for instance when
// the result reaches cap(dst), which the server sets to the most extents it will send (more
// are dropped). The server calls it concurrently, like ReadAt; off and length are within the
// device. An error is answered to the client like a failed ReadAt.
type BlockStatuser interface {
	BlockStatus(off, length int64, dst []Extent) ([]Extent, error)
}

// Extent is one range of a BlockStatus answer.
type Extent struct {
	Length int64
	Flags  ExtentFlags
}

// ExtentFlags are the base:allocation states of an Extent.
type ExtentFlags uint32

const (
	// ExtentHole: the range is not allocated (NBD_STATE_HOLE). Report it only together with
	// ExtentZero unless the range may read as anything.
	ExtentHole ExtentFlags = 1 << 0
	// ExtentZero: the range reads as zeroes (NBD_STATE_ZERO).
	ExtentZero ExtentFlags = 1 << 1
)

// Errors from Device methods reach the client as an NBD error value. If errors.As finds an
// error in the chain with a method
//
//	Errno() uint32
//
// its value is sent (when it is one of EPERM 1, EIO 5, EINVAL 22, ENOSPC 28, EOVERFLOW 75 or
// ESHUTDOWN 108; anything else becomes EIO). Otherwise a syscall.Errno is mapped to the nearest
// value (EPERM, EACCES, EROFS → EPERM; ENOSPC, EDQUOT, EFBIG → ENOSPC; EINVAL; EOVERFLOW;
// ESHUTDOWN), and every other error is EIO. The connection stays usable after a failed request.
