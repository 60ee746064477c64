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

// ReadAt reads with pread, retrying EINTR and short reads. A sparse file that ends before the
// member size (never the case for a member raid5d created) reads as zeroes up to Size.
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
			end := min(int64(len(p)), m.size-off)
			if int64(n) >= end {
				return n, io.EOF
			}
			clear(p[n:end])
			n = int(end)
			if n < len(p) {
				return n, io.EOF
			}
			break
		}
		n += k
	}
	return n, nil
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
// Like ReadAt, a short count comes with an error.
func readv(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	if v, ok := m.(vectorMember); ok {
		return v.ReadvAt(bufs, off, iov)
	}
	n := 0
	for _, b := range bufs {
		k, err := m.ReadAt(b, off+int64(n))
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
// short read (end of a sparse file) with ReadAt.
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
