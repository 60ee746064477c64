package raid

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Member is one disk of the array as the array sees it: a regular file, a block device, or in
// tests an in-memory fake (raid/raidtest).
//
// ReadAt and WriteAt follow io.ReaderAt and io.WriterAt: a short count comes with an error, and
// neither keeps p. All methods may be called concurrently, including ReadAt and WriteAt on
// overlapping ranges (the array never does that for one stripe without holding its lock).
//
// A member's ReadAt returns len(p) bytes or an error. The array holds every member to that
// (readFull, readv): a short count — with io.EOF, as io.ReaderAt allows at the end of its
// input, or with no error at all — is a read error of the member, ErrShortRead, never bytes
// to be filled with zeroes. A member has Size bytes from assembly on; one that ends sooner
// has lost data (a file truncated under the array).
type Member interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes completed writes durable (fdatasync).
	Sync() error
	// Trim releases [off, off+length); afterwards the range must read as zeroes — the array's
	// parity relies on it. Files punch a hole; block devices zero the range (see doc.go).
	Trim(off, length int64) error
	// Size is the member's size in bytes, fixed while it is open.
	Size() int64
	Close() error
	// Name identifies the member in messages: its path.
	Name() string
}

// fileMember is a Member on a regular file or a block device.
type fileMember struct {
	f     *os.File
	fd    int
	path  string
	size  int64
	block bool

	// The file mapped read-only for mapped reads (mapped.go), made at the first use; nil if
	// none could be made. Unmapped by Close.
	mapOnce sync.Once
	mapped  []byte
}

// OpenMember opens a regular file or a block device as a member, for exclusive use: it holds a
// lock on it until Close, exclusive when read-write (and a block device is opened with O_EXCL),
// shared when readOnly (doc.go # Exclusive use). A member in use elsewhere is ErrMemberBusy,
// in a *BusyError naming the holder. A block device's size comes from BLKGETSIZE64, a file's
// from its length. A path of the form faulty:PATH?... (or volatile:PATH?..., short for
// faulty:PATH?volatile&...) opens PATH wrapped in fault injection, a testing aid (doc.go #
// Testing with faulty members).
func OpenMember(path string, readOnly bool) (Member, error) {
	if readOnly {
		return openMember(path, useShared)
	}
	return openMember(path, useExclusive)
}

// openMember is OpenMember with the use (and lock) spelled out; Examine inspects members
// without a lock.
func openMember(path string, use memberUse) (Member, error) {
	if m, ok, err := openSpec(path, use); ok {
		return m, err
	}
	f, err := openUse(path, use)
	if err != nil {
		return nil, err
	}
	m, err := newFileMember(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

func newFileMember(f *os.File, path string) (*fileMember, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	m := &fileMember{f: f, fd: int(f.Fd()), path: path}
	switch {
	case st.Mode().IsRegular():
		m.size = st.Size()
	case st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0:
		sz, err := unix.IoctlGetUint64(m.fd, unix.BLKGETSIZE64)
		if err != nil {
			return nil, &os.PathError{Op: "BLKGETSIZE64", Path: path, Err: err}
		}
		m.size, m.block = int64(sz), true
	default:
		return nil, &os.PathError{Op: "open member", Path: path, Err: errors.New("not a regular file or block device")}
	}
	return m, nil
}

// createMemberFile creates an absent member file, sparse, of size bytes, mode 0600: it will
// hold the array's data.
func createMemberFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

func (m *fileMember) Name() string { return m.path }
func (m *fileMember) Size() int64  { return m.size }
func (m *fileMember) Close() error { return errors.Join(m.unmap(), m.f.Close()) }

// ReadAt reads with pread, retrying EINTR and short reads. The end of the file before Size is
// ErrShortRead (shortRead), never zeroes: a file is Size bytes when it is opened, and holes
// within it read as zeroes by pread itself, so an end of file within Size means the file was
// truncated under the array. A read past Size ends there with io.EOF, as io.ReaderAt's do.
func (m *fileMember) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, &os.PathError{Op: "read", Path: m.path, Err: unix.EINVAL}
	}
	n := 0
	for n < len(p) {
		k, err := unix.Pread(m.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "pread", Path: m.path, Err: err}
		}
		if k == 0 { // end of file
			if off+int64(n) >= m.size {
				return n, io.EOF
			}
			return n, m.shortRead("pread", off, n, len(p))
		}
		n += k
	}
	return n, nil
}

// shortRead is the error of a read at off that met the end of the file after n of want bytes:
// ErrShortRead, saying how long the member is now against its size at open.
func (m *fileMember) shortRead(op string, off int64, n, want int) error {
	now := "unknown"
	if sz, err := m.sizeNow(); err == nil {
		now = fmt.Sprint(sz)
	}
	return &os.PathError{Op: op, Path: m.path, Err: fmt.Errorf("%w: end of file after %d of %d bytes at offset %d; the member is now %s bytes, %d when opened",
		ErrShortRead, n, want, off, now, m.size)}
}

// sizeNow is the member's size now: fstat for a file, BLKGETSIZE64 for a block device.
func (m *fileMember) sizeNow() (int64, error) {
	if m.block {
		sz, err := unix.IoctlGetUint64(m.fd, unix.BLKGETSIZE64)
		return int64(sz), err
	}
	var st unix.Stat_t
	err := retryEINTR(func() error { return unix.Fstat(m.fd, &st) })
	return st.Size, err
}

// readFull reads len(p) bytes of m at off with ReadAt, holding m to the Member contract: a
// short count, with io.EOF or with no error, is ErrShortRead. It is how the array reads members.
func readFull(m Member, p []byte, off int64) (int, error) {
	n, err := m.ReadAt(p, off)
	return n, checkRead(off, n, len(p), err)
}

// checkRead is the error of a member read at off that returned n of want bytes and err: nil
// for a full read (io.EOF with a full count too, as io.ReaderAt allows), ErrShortRead for a
// short one that came with io.EOF or with no error, else err.
func checkRead(off int64, n, want int, err error) error {
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

// WriteAt writes with pwrite, retrying EINTR and short writes. Writes past Size are refused.
func (m *fileMember) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > m.size {
		return 0, &os.PathError{Op: "write", Path: m.path, Err: fmt.Errorf("range [%d, %d) outside member of %d bytes", off, off+int64(len(p)), m.size)}
	}
	n := 0
	for n < len(p) {
		k, err := unix.Pwrite(m.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "pwrite", Path: m.path, Err: err}
		}
		if k == 0 {
			return n, &os.PathError{Op: "pwrite", Path: m.path, Err: io.ErrShortWrite}
		}
		n += k
	}
	return n, nil
}

// maxIov is the most buffers one vectored call takes (Linux's IOV_MAX).
const maxIov = 1024

// vectorMember is a Member that reads into, or writes from, several buffers at consecutive
// member offsets in one system call (preadv, pwritev). The array uses it to merge the member
// ranges of a request that are contiguous on a member (a member's data chunks in consecutive
// stripes are contiguous but for its parity chunks) into one call; members without it get
// one ReadAt or WriteAt per buffer (readv, writev). iov is the caller's scratch space for
// the call's iovecs, so that the call allocates nothing; len(bufs) ≤ maxIov.
type vectorMember interface {
	ReadvAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error)
	WritevAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error)
}

// readv reads bufs from m at consecutive offsets from off: one preadv where m supports it.
// Like readFull, it returns the full length or an error, a short count being ErrShortRead.
func readv(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	if v, ok := m.(vectorMember); ok {
		want := 0
		for _, b := range bufs {
			want += len(b)
		}
		n, err := v.ReadvAt(bufs, off, iov)
		return n, checkRead(off, n, want, err)
	}
	n := 0
	for _, b := range bufs {
		k, err := readFull(m, b, off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writev writes bufs to m at consecutive offsets from off: one pwritev where m supports it.
func writev(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	if v, ok := m.(vectorMember); ok {
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

// iovecs fills iov with bufs, skipping the first skip bytes, and returns the filled part.
func iovecs(iov []unix.Iovec, bufs [][]byte, skip int) []unix.Iovec {
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

// vec calls preadv or pwritev (trap) on iov at off, retrying EINTR. It calls the system call
// directly because unix.Preadv builds its iovecs in a new slice on every call.
func (m *fileMember) vec(trap uintptr, iov []unix.Iovec, off int64) (int, error) {
	lo, hi := uintptr(off), uintptr(uint64(off)>>(unix.SizeofLong*8-1)>>1) // as the kernel splits pos
	for {
		r, _, e := unix.Syscall6(trap, uintptr(m.fd), uintptr(unsafe.Pointer(unsafe.SliceData(iov))),
			uintptr(len(iov)), lo, hi, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

// ReadvAt reads bufs at consecutive offsets from off with preadv (vectorMember), finishing a
// short read with ReadAt: its end of file is ErrShortRead, as for ReadAt.
func (m *fileMember) ReadvAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if off < 0 || len(bufs) > maxIov {
		return 0, &os.PathError{Op: "preadv", Path: m.path, Err: unix.EINVAL}
	}
	n, err := m.vec(unix.SYS_PREADV, iovecs(iov, bufs, 0), off)
	if err != nil {
		return 0, &os.PathError{Op: "preadv", Path: m.path, Err: err}
	}
	for n < total { // short: the rest buffer by buffer
		b, skip := bufAt(bufs, n)
		k, err := m.ReadAt(b[skip:], off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// WritevAt writes bufs at consecutive offsets from off with pwritev (vectorMember), finishing
// a short write with WriteAt. Writes past Size are refused.
func (m *fileMember) WritevAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if off < 0 || off+int64(total) > m.size || len(bufs) > maxIov {
		return 0, &os.PathError{Op: "pwritev", Path: m.path, Err: fmt.Errorf("range [%d, %d) outside member of %d bytes, or %d buffers", off, off+int64(total), m.size, len(bufs))}
	}
	n, err := m.vec(unix.SYS_PWRITEV, iovecs(iov, bufs, 0), off)
	if err != nil {
		return 0, &os.PathError{Op: "pwritev", Path: m.path, Err: err}
	}
	for n < total {
		b, skip := bufAt(bufs, n)
		k, err := m.WriteAt(b[skip:], off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// bufAt returns the buffer of bufs that holds byte n of their concatenation, and n's offset in it.
func bufAt(bufs [][]byte, n int) ([]byte, int) {
	for _, b := range bufs {
		if n < len(b) {
			return b, n
		}
		n -= len(b)
	}
	return nil, 0
}

func (m *fileMember) Sync() error {
	for {
		err := unix.Fdatasync(m.fd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "fdatasync", Path: m.path, Err: err}
		}
		return nil
	}
}

// syncData is how a flush syncs a member: Sync, then, for a file or block device, a check that
// it is still Size bytes (checkSize). One truncated under the array is then failed at the next
// flush even when no read has met its new end — or when a write past that end has grown the
// file again, leaving a hole that reads as zeroes. (Superblock updates call Sync alone: a
// shrunk member must not stop the array from recording state, only be failed itself.)
func syncData(m Member) error {
	if err := m.Sync(); err != nil {
		return err
	}
	if fm, ok := m.(*fileMember); ok {
		return fm.checkSize()
	}
	return nil
}

// checkSize is ErrMemberShrunk if the member is now smaller than when it was opened, else nil
// (also when its size cannot be read: that is for its I/O to report).
func (m *fileMember) checkSize() error {
	if now, err := m.sizeNow(); err == nil && now < m.size {
		return &os.PathError{Op: "fstat", Path: m.path, Err: fmt.Errorf("%w: %d bytes, %d when opened", ErrMemberShrunk, now, m.size)}
	}
	return nil
}

// Trim punches a hole (FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE). On a block device the kernel
// turns that into a zero-out that may unmap, guaranteed to read back zeroes; where it is not
// supported a block device falls back to BLKZEROOUT, and anything else to writing zeroes.
func (m *fileMember) Trim(off, length int64) error {
	if off < 0 || length < 0 || off+length > m.size {
		return &os.PathError{Op: "trim", Path: m.path, Err: unix.EINVAL}
	}
	if length == 0 {
		return nil
	}
	err := retryEINTR(func() error {
		return unix.Fallocate(m.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	})
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return &os.PathError{Op: "fallocate", Path: m.path, Err: err}
	}
	if m.block {
		r := [2]uint64{uint64(off), uint64(length)}
		err := retryEINTR(func() error { return ioctlPtr(m.fd, unix.BLKZEROOUT, &r) })
		if err == nil {
			return nil
		}
	}
	return writeZeroes(m, off, length)
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// zeroBuf is a shared, never-written buffer of zeroes.
var zeroBuf = make([]byte, 1<<20)

func writeZeroes(w io.WriterAt, off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroBuf)))
		if _, err := w.WriteAt(zeroBuf[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}
