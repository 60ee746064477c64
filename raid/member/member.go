package member

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// Member is one disk of an array as the array sees it: a regular file or a block device
// (File), a member of another kind (Register), or in tests an in-memory fake (raid/raidtest).
//
// ReadAt and WriteAt follow io.ReaderAt and io.WriterAt: a short count comes with an error, and
// neither keeps p. All methods may be called concurrently, including ReadAt and WriteAt on
// overlapping ranges (the array never does that for one stripe without holding its lock).
//
// Unlike io.ReaderAt, a member's ReadAt returns len(p) bytes or an error. The array holds
// every member to that (ReadFull, Readv): a short count — with io.EOF, as io.ReaderAt allows
// at the end of its input, or with no error at all — is a read error of the member,
// ErrShortRead, never bytes to be filled with zeroes. A member has Size bytes from assembly
// on; one that ends sooner has lost data (a file truncated under the array, a remote export
// that answers with less than was asked).
type Member interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes completed writes durable (fdatasync). It is not optional: a member whose
	// writes are durable on return (an in-memory fake) returns nil.
	Sync() error
	// Trim releases [off, off+length); afterwards the range must read as zeroes — the array's
	// parity relies on it. Files punch a hole; block devices zero the range (package doc);
	// a member that cannot release space writes zeroes (WriteZeroes).
	Trim(off, length int64) error
	// Size is the member's size in bytes, fixed while it is open.
	Size() int64
	Close() error
	// Name identifies the member in messages and is what the array records and matches a
	// member by: the spec it was opened with (a path, or a URI for a remote kind).
	Name() string
}

// The optional capabilities of a member. The array asks for them with a type assertion on
// the member it holds; a wrapper that embeds Member (raid/member/faulty) hides them, so that
// every operation goes through it.

// MaxIov is the most buffers one vectored call takes (Linux's IOV_MAX).
const MaxIov = 1024

// Vectored is a Member that reads into, or writes from, several buffers at consecutive
// member offsets in one call (preadv, pwritev). The array uses it to merge the member ranges
// of a request that are contiguous on a member (a member's data chunks in consecutive stripes
// are contiguous but for its parity chunks) into one call; members without it get one ReadAt
// or WriteAt per buffer (Readv, Writev). iov is the caller's scratch space for the call's
// iovecs, so that the call allocates nothing; len(bufs) ≤ MaxIov. ReadvAt keeps ReadAt's
// contract: the full length or an error.
type Vectored interface {
	ReadvAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error)
	WritevAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error)
}

// DSyncWriter is a Member that can write one range durably by itself, without a Sync of
// everything written before (pwritev2 RWF_DSYNC; FUA on a remote member). The write-intent
// bitmap uses it where a member has it, else WriteAt and Sync.
type DSyncWriter interface {
	WriteAtDSync(p []byte, off int64) (int, error)
}

// SizeChecker is a Member whose size can change under it (a file truncated, a block device
// shrunk, an export resized): CheckSize is ErrShrunk if it is now smaller than Size, else
// nil. SyncData calls it after every Sync of a flush.
type SizeChecker interface {
	CheckSize() error
}

// Rechecker is a Member that reaches what it stands for over connections it makes by itself
// (a remote member: its several connections, and reconnections once one broke:
// raid/member/nbdmember). SetRecheck says how to tell that what answers on a connection is
// this member: the owner calls it once the member carries what check looks for (its
// superblock read or written), and before the member uses any other connection — those it
// opens then, and every reconnection — it calls check with a reader of the export through
// that connection; SetRecheck runs it on the connections in use too. An error fails the member
// for good (every request from then on returns an error wrapping it, and SetRecheck returns
// it if it was one of its own checks) rather than have the export's bytes taken for the
// member's. An error of the reader itself (the connection broke) only fails that connection.
// It is looked up under wrappers (Base), as Reporter is; the last function set is used (nil:
// no check).
type Rechecker interface {
	SetRecheck(check func(r io.ReaderAt) error) error
}

// Mapper is a Member whose bytes can be read from a read-only mapping of it into memory
// (mapped reads, File's mapped.go): see raid/mapped.go for what keeps that correct.
type Mapper interface {
	// Mapping returns the member mapped read-only in full, mapping it at the first call, or
	// nil if it cannot be mapped. Its pages may fault (SIGBUS) when touched.
	Mapping() []byte
	// Remap replaces the mapping with a fresh one at the same address, releasing the page
	// tables the old one accumulated; readers of the old one are unaffected.
	Remap() error
	// Touch records that the caller has used the n bytes at off of the mapping (read or
	// written them, or handed them to the kernel), and replaces the mapping (Remap) when
	// the page tables it has accumulated call for it; the error is Remap's.
	Touch(off, n int64) error
	// CopyMapped copies the member's bytes at off into p from the mapping and reports
	// whether it could; false (a fault, a range past the end of the file) sends the caller
	// to ReadAt, which reports the error.
	CopyMapped(p []byte, off int64) bool
	// InFile reports whether the range of Mapping() that ends at end lies within the member
	// now, catching a fault (false): a page the end of a truncated file falls in reads as
	// zeroes past that end.
	InFile(mp []byte, end int64) bool
}

// MappedWriter is a Member whose bytes can be written through a writable mapping of it: the
// array's placed writes (IOOptions.MappedWrites), whose payload the kernel copies from the
// socket straight into the mapping. Nothing copies into it in user space: a copy there can be
// cut anywhere by the daemon's death (SIGKILL), tearing a 4 KiB unit, where the kernel's
// copies (pwrite's, a socket read's) stop only between pages.
type MappedWriter interface {
	// WritableRange returns the n bytes at off of the writable mapping when its pages are all
	// in memory, else nil. The caller writes them under the fault handling of its choice
	// (SetPanicOnFault) and then checks with Covers that the file still covers them.
	WritableRange(off, n int64) []byte
	// Covers reports whether the file covers [0, end) now.
	Covers(end int64) bool
}

// HoleFinder is a Member that can tell where its holes are (regular files, through lseek
// SEEK_DATA/SEEK_HOLE); the array's block status reports every other member as data.
type HoleFinder interface {
	// NextData returns the member offset of the first byte at or after off that may hold
	// data, or end if there is none before end; ok is false when the member cannot tell.
	NextData(off, end int64) (data int64, ok bool, err error)
	// NextHole returns the member offset of the first byte at or after off (off < end) that
	// is in a hole, or end if there is none before end.
	NextHole(off, end int64) (int64, error)
}

// Wrapper is a Member that wraps another (fault injection): Unwrap returns it. Base follows
// the chain.
type Wrapper interface {
	Unwrap() Member
}

// Base returns the member under m's wrappers (Wrapper), m itself if it wraps none.
func Base(m Member) Member {
	for {
		w, ok := m.(Wrapper)
		if !ok {
			return m
		}
		m = w.Unwrap()
	}
}

// ReadFull reads len(p) bytes of m at off with ReadAt, holding m to the Member contract: a
// short count, with io.EOF or with no error, is ErrShortRead. It is how the array reads members.
func ReadFull(m Member, p []byte, off int64) (int, error) {
	n, err := m.ReadAt(p, off)
	return n, CheckRead(off, n, len(p), err)
}

// CheckRead is the error of a member read at off that returned n of want bytes and err: nil
// for a full read (io.EOF with a full count too, as io.ReaderAt allows), ErrShortRead for a
// short one that came with io.EOF or with no error, else err.
func CheckRead(off int64, n, want int, err error) error {
	switch {
	case n >= want && (err == nil || err == io.EOF):
		return nil
	case err == nil:
		return fmt.Errorf("%w: %d of %d bytes at offset %d, and no error", ErrShortRead, n, want, off)
	case errors.Is(err, io.EOF) && !errors.Is(err, ErrShortRead):
		return fmt.Errorf("%w: %d of %d bytes at offset %d: %w", ErrShortRead, n, want, off, err)
	}
	return err
}

// Readv reads bufs from m at consecutive offsets from off: one ReadvAt where m is Vectored.
// Like ReadFull, it returns the full length or an error, a short count being ErrShortRead.
func Readv(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	if v, ok := m.(Vectored); ok {
		want := 0
		for _, b := range bufs {
			want += len(b)
		}
		n, err := v.ReadvAt(bufs, off, iov)
		return n, CheckRead(off, n, want, err)
	}
	n := 0
	for _, b := range bufs {
		k, err := ReadFull(m, b, off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Writev writes bufs to m at consecutive offsets from off: one WritevAt where m is Vectored.
func Writev(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	if v, ok := m.(Vectored); ok {
		return v.WritevAt(bufs, off, iov)
	}
	n := 0
	for _, b := range bufs {
		k, err := m.WriteAt(b, off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Iovecs fills iov with bufs, skipping the first skip bytes, and returns the filled part.
func Iovecs(iov []unix.Iovec, bufs [][]byte, skip int) []unix.Iovec {
	iov = iov[:0]
	for _, b := range bufs {
		if skip >= len(b) { // also skips empty buffers
			skip -= len(b)
			continue
		}
		b = b[skip:]
		skip = 0
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	return iov
}

// SyncData is how a flush syncs a member: Sync, then, for a SizeChecker, a check that it is
// still Size bytes. One truncated under the array is then failed at the next flush even when
// no read has met its new end — or when a write past that end has grown the file again,
// leaving a hole that reads as zeroes. (Superblock updates call Sync alone: a shrunk member
// must not stop the array from recording state, only be failed itself.)
func SyncData(m Member) error {
	if err := m.Sync(); err != nil {
		return err
	}
	if c, ok := m.(SizeChecker); ok {
		return c.CheckSize()
	}
	return nil
}
