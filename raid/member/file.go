package member

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/raid5d/raid5d/internal/aligned"
	"golang.org/x/sys/unix"
)

// File is a Member on a regular file or a block device, the kind a plain path opens. Besides
// Member it has every optional capability: Vectored (preadv, pwritev), DSyncWriter
// (pwritev2 RWF_DSYNC), SizeChecker, Mapper and MappedWriter (mapped.go) and HoleFinder
// (holes.go).
//
// A File opened for direct I/O (SetDirect; package doc # Direct I/O) reads and writes with
// O_DIRECT: calls whose memory, offset and length are aligned to its block (Direct) go to the
// device as they are, any other through a bounce buffer (direct.go), so none fails for its
// alignment. Its Mapping is nil: mapped reads and writes would go through the page cache it
// bypasses.
type File struct {
	f     *os.File
	fd    int
	path  string
	size  int64
	block bool

	direct  bool          // opened with O_DIRECT (initDirect)
	align   int64         // direct: the alignment of memory, offsets and lengths its calls need
	rmwMu   sync.Mutex    // direct: serialises bounced writes that rewrite a block in part
	bounced atomic.Uint64 // direct: calls carried through a bounce buffer (Bounced)

	// The file mapped for mapped reads and writes (mapped.go), made at the first use with
	// protection prot; nil if none could be made. Unmapped by Close.
	mapOnce sync.Once
	mapped  []byte
	prot    int
	// The mapping's page-table regions touched since it was made (Touch): a bit per
	// ptRegion of the file, their count, and the remaps Touch has done.
	touched  []atomic.Uint64
	nTouched atomic.Int64
	remapMu  sync.Mutex
	remaps   atomic.Uint64
	// A bit per residentRegion of the file that mincore found wholly in memory since the
	// last Remap, Trim over it or size check that failed (WritableRange), and the count of
	// forgettings, which a mincore that raced one does not outlive (findResident).
	inMemory []atomic.Uint64
	forgets  atomic.Uint64
	// A regular file's last page (from tailOff) mapped read-only on its own, made at open (nil
	// if it could not be): whether the file still reaches into it is a load that faults once
	// a truncation has cut the file below it (reachesTail), where an fstat is a system call.
	tail    []byte
	tailOff int64
	// grown is set once the write guard has found the file truncated under the array and grown
	// back by one of its writes: reads of it are refused from then on (readGuard).
	grown atomic.Bool
}

// OpenFile opens a regular file or a block device as a member, for use (see Use): it holds a
// lock on it until Close, exclusive for Exclusive (and a block device is then opened with
// O_EXCL), shared for Shared, none for Inspect (package doc # Exclusive use). A member in use
// elsewhere is ErrBusy, in a *BusyError naming the holder. A block device's size comes from
// BLKGETSIZE64, a file's from its length. It is opened for direct I/O as SetDirect says; a
// file that cannot do it under DirectOn is ErrNoDirect, in an *os.PathError naming it.
func OpenFile(path string, use Use) (*File, error) {
	mode := DirectMode()
	direct := wantDirect(path, mode)
	f, err := openUse(path, use, direct)
	if err != nil && direct && errors.Is(err, unix.EINVAL) { // O_DIRECT refused at the open
		if mode != DirectAuto {
			return nil, &os.PathError{Op: "open O_DIRECT", Path: path, Err: fmt.Errorf("%w: %w", ErrNoDirect, unix.EINVAL)}
		}
		direct = false
		f, err = openUse(path, use, false)
	}
	if err != nil {
		return nil, err
	}
	m, err := newFileMember(f, path)
	if err == nil && direct {
		err = m.initDirect(mode)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

func newFileMember(f *os.File, path string) (*File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	m := &File{f: f, fd: int(f.Fd()), path: path}
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
	// Here, not with the mapping: Trim forgets regions whether or not the file is mapped yet.
	m.inMemory = make([]atomic.Uint64, (m.size+residentRegion*64-1)/(residentRegion*64))
	m.mapTail()
	return m, nil
}

// CreateFile creates an absent member file, sparse, of size bytes, mode 0600: it will
// hold the array's data.
func CreateFile(path string, size int64) error {
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

func (m *File) Name() string { return m.path }
func (m *File) Size() int64  { return m.size }
func (m *File) Close() error { return errors.Join(m.unmap(), m.unmapTail(), m.f.Close()) }

// ReadAt reads with pread, retrying EINTR and short reads. The end of the file before Size is
// ErrShortRead (shortRead), never zeroes: a file is Size bytes when it is opened, and holes
// within it read as zeroes by pread itself, so an end of file within Size means the file was
// truncated under the array. A read past Size ends there with io.EOF, as io.ReaderAt's do.
//
// A direct member reads an unaligned p or range through a bounce buffer (bounceRead).
func (m *File) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, &os.PathError{Op: "read", Path: m.path, Err: unix.EINVAL}
	}
	n := 0
	for n < len(p) {
		if !m.isAligned(p[n:], off+int64(n)) { // a direct member, or a direct read that ended short
			k, err := m.bounceRead([][]byte{p[n:]}, len(p)-n, off+int64(n))
			if err == nil {
				err = m.readGuard("pread", off, n+k)
			}
			return n + k, err
		}
		k, err := unix.Pread(m.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "pread", Path: m.path, Err: err}
		}
		if k == 0 { // end of file
			return n, m.readEnd(off, n, len(p))
		}
		n += k
	}
	return n, m.readGuard("pread", off, n)
}

// readGuard is the check after a read of n bytes at off that returned them all. A file
// truncated under the array and grown back by one of the array's writes past its new end has
// a hole between the two that pread and the mapping read as zeroes, which must not be
// returned as the member's data: once the write guard has found the file grown (grown), every
// read of it is ErrShortRead, and the array reconstructs the range from the other members, in
// the moment until the member is failed with that write. (Between the growing write and the
// guard's check after it, a read can still see the hole; a file grown by another writer is
// not seen: TestShrunkMember* and the README's members section say what is covered.)
func (m *File) readGuard(op string, off int64, n int) error {
	if !m.grown.Load() {
		return nil
	}
	return &os.PathError{Op: op, Path: m.path, Err: fmt.Errorf("%w: the member was truncated under the array and grown back by a write (a read at %d of %d bytes)",
		ErrShortRead, off, n)}
}

// readEnd is the error of a read at off that met the end of the file after n of want bytes:
// io.EOF at or past Size, else ErrShortRead (shortRead).
func (m *File) readEnd(off int64, n, want int) error {
	if off+int64(n) >= m.size {
		return io.EOF
	}
	return m.shortRead("pread", off, n, want)
}

// shortRead is the error of a read at off that met the end of the file after n of want bytes:
// ErrShortRead, saying how long the member is now against its size at open.
func (m *File) shortRead(op string, off int64, n, want int) error {
	now := "unknown"
	if sz, err := m.sizeNow(); err == nil {
		now = fmt.Sprint(sz)
	}
	return &os.PathError{Op: op, Path: m.path, Err: fmt.Errorf("%w: end of file after %d of %d bytes at offset %d; the member is now %s bytes, %d when opened",
		ErrShortRead, n, want, off, now, m.size)}
}

// sizeNow is the member's size now: fstat for a file, BLKGETSIZE64 for a block device.
func (m *File) sizeNow() (int64, error) {
	if m.block {
		sz, err := unix.IoctlGetUint64(m.fd, unix.BLKGETSIZE64)
		return int64(sz), err
	}
	var st unix.Stat_t
	err := retryEINTR(func() error { return unix.Fstat(m.fd, &st) })
	return st.Size, err
}

// WriteAt writes with pwrite, retrying EINTR and short writes. Writes past Size are refused.
// A direct member writes an unaligned p or range through a bounce buffer (bounceWrite). A
// file found truncated under the array, before or after the write, is ErrShrunk (guardWrite).
func (m *File) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > m.size {
		return 0, &os.PathError{Op: "write", Path: m.path, Err: fmt.Errorf("range [%d, %d) outside member of %d bytes", off, off+int64(len(p)), m.size)}
	}
	end := off + int64(len(p))
	if err := m.guardWrite(end, false); err != nil {
		return 0, err
	}
	n, err := m.writeAt(p, off)
	if err == nil {
		err = m.guardWrite(end, true)
	}
	return n, err
}

// guardWrite keeps a file truncated under the array from being grown back by the array's own
// writes unnoticed. pwrite past a file's end extends it without an error, and the hole it leaves
// between the old end and the write reads as zeroes, which reads would return as data and
// read-modify-writes fold into parity. So after every write to a file (after true) its size is
// checked: a file now smaller than Size that ends at or before this write's end (end) may have
// been grown by it — ErrShrunk, and the member is failed with the write. (One that still ends
// past the write was not grown by it: a read past its end or the next flush fails it.) A write
// that ends at Size would grow the file back whole, leaving nothing for the check after it to
// see, so its size is checked before it too (after false), and one the write would grow is
// refused; what is left is a truncation between that check and the write. Of concurrent writes
// that grew the file, the one that ended last finds it ending at its end. A block device cannot
// grow by a write (one that shrank refuses writes past its end), so it is not checked.
//
// Before a write that ends before Size the same load tells whether the file is cut at all;
// one that is cut is fstat'ed, and a write that would end past its new end (grow it) is
// refused: so the array's writes do not grow a cut file back and leave a hole that reads as
// zeroes, save a truncation between that load and the write (TestReadGrownBack).
//
// The check after a write that ends before the file's last page is a load (reachesTail), not
// an fstat: a file cut anywhere before that page and grown by this write only as far as its end
// still does not reach into it. fstat is for the writes into the last page, and for a file found
// cut (to tell a write that grew it from one within its new end).
func (m *File) guardWrite(end int64, after bool) error {
	if m.block || (!after && end < m.size && (m.tail == nil || m.reachesTail())) || (after && end <= m.tailOff && m.reachesTail()) {
		return nil
	}
	now, err := m.sizeNow()
	if err != nil || now >= m.size || now > end {
		return nil // an fstat that fails: for the next I/O to report
	}
	what := fmt.Sprintf("%d bytes after a write ending at %d", now, end)
	if !after {
		what = fmt.Sprintf("%d bytes before a write ending at %d, refused", now, end)
	} else {
		m.grown.Store(true) // reads of the hole it left are refused from now on (readGuard)
	}
	return &os.PathError{Op: "pwrite", Path: m.path, Err: fmt.Errorf("%w: %s, %d when opened: truncated under the array, and grown back by its writes",
		ErrShrunk, what, m.size)}
}

// writeAt is WriteAt's write, without the range check and the size guard.
func (m *File) writeAt(p []byte, off int64) (int, error) {
	if !m.isAligned(p, off) {
		return m.bounceWrite([][]byte{p}, len(p), off, 0)
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

// vec calls preadv or pwritev (trap) on iov at off, retrying EINTR. It calls the system call
// directly because unix.Preadv builds its iovecs in a new slice on every call.
func (m *File) vec(trap uintptr, iov []unix.Iovec, off int64) (int, error) {
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

// ReadvAt reads bufs at consecutive offsets from off with preadv (Vectored), finishing a
// short read with ReadAt: its end of file is ErrShortRead, as for ReadAt.
func (m *File) ReadvAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if off < 0 || len(bufs) > MaxIov {
		return 0, &os.PathError{Op: "preadv", Path: m.path, Err: unix.EINVAL}
	}
	if !m.vecAligned(bufs, off) {
		n, err := m.bounceRead(bufs, total, off)
		if err == nil {
			err = m.readGuard("preadv", off, n)
		}
		return n, err
	}
	n, err := m.vec(unix.SYS_PREADV, Iovecs(iov, bufs, 0), off)
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
	return n, m.readGuard("preadv", off, n)
}

// WritevAt writes bufs at consecutive offsets from off with pwritev (Vectored), finishing
// a short write with WriteAt. Writes past Size are refused.
func (m *File) WritevAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if off < 0 || off+int64(total) > m.size || len(bufs) > MaxIov {
		return 0, &os.PathError{Op: "pwritev", Path: m.path, Err: fmt.Errorf("range [%d, %d) outside member of %d bytes, or %d buffers", off, off+int64(total), m.size, len(bufs))}
	}
	end := off + int64(total)
	if err := m.guardWrite(end, false); err != nil {
		return 0, err
	}
	n, err := m.writevAt(bufs, total, off, iov)
	if err == nil {
		err = m.guardWrite(end, true)
	}
	return n, err
}

// writevAt is WritevAt's write, without the range check and the size guard.
func (m *File) writevAt(bufs [][]byte, total int, off int64, iov []unix.Iovec) (int, error) {
	if !m.vecAligned(bufs, off) {
		return m.bounceWrite(bufs, total, off, 0)
	}
	n, err := m.vec(unix.SYS_PWRITEV, Iovecs(iov, bufs, 0), off)
	if err != nil {
		return 0, &os.PathError{Op: "pwritev", Path: m.path, Err: err}
	}
	for n < total {
		b, skip := bufAt(bufs, n)
		k, err := m.writeAt(b[skip:], off+int64(n))
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

func (m *File) Sync() error {
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

// CheckSize (SizeChecker) is ErrShrunk, in an *os.PathError, if the member is now smaller than when it was opened, else nil
// (also when its size cannot be read: that is for its I/O to report).
func (m *File) CheckSize() error {
	if now, err := m.sizeNow(); err == nil && now < m.size {
		return &os.PathError{Op: "fstat", Path: m.path, Err: fmt.Errorf("%w: %d bytes, %d when opened", ErrShrunk, now, m.size)}
	}
	return nil
}

// WriteAtDSync (DSyncWriter) writes p at off with pwritev2(RWF_DSYNC): durable on return, like
// a write and an fdatasync of just this range. Falls back to pwrite and fdatasync where the
// kernel or file system refuses the flag. A direct member writes an unaligned p or range
// through a bounce buffer. Writes past Size are refused, and the size guarded as WriteAt's.
func (m *File) WriteAtDSync(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	if off < 0 || end > m.size {
		return m.WriteAt(p, off) // refused
	}
	if err := m.guardWrite(end, false); err != nil {
		return 0, err
	}
	n, err := m.writeAtDSync(p, off)
	if err == nil {
		err = m.guardWrite(end, true)
	}
	return n, err
}

// writeAtDSync is WriteAtDSync's write, without the range check and the size guard.
func (m *File) writeAtDSync(p []byte, off int64) (int, error) {
	if !m.isAligned(p, off) {
		return m.bounceWrite([][]byte{p}, len(p), off, unix.RWF_DSYNC)
	}
	n := 0
	for n < len(p) {
		k, e := unix.Pwritev2(m.fd, [][]byte{p[n:]}, off+int64(n), unix.RWF_DSYNC)
		if e == unix.EINTR {
			continue
		}
		if e == unix.EOPNOTSUPP || e == unix.ENOSYS || e == unix.EINVAL {
			if _, err := m.writeAt(p[n:], off+int64(n)); err != nil {
				return n, err
			}
			return len(p), m.Sync()
		}
		if e != nil {
			return n, e
		}
		n += k
	}
	return n, nil
}

// Trim punches a hole (FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE). On a block device the kernel
// turns that into a zero-out that may unmap, guaranteed to read back zeroes; where it is not
// supported a block device falls back to BLKZEROOUT, and anything else to writing zeroes.
func (m *File) Trim(off, length int64) error {
	if off < 0 || length < 0 || off+length > m.size {
		return &os.PathError{Op: "trim", Path: m.path, Err: unix.EINVAL}
	}
	if length == 0 {
		return nil
	}
	// The hole is not in memory: forgotten after it is punched, so that a mincore of the
	// region by a placement of other stripes before the punch cannot be remembered after it
	// (findResident), and before, for the fallbacks below.
	m.forgetResident(off, length)
	defer m.forgetResident(off, length)
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
	return WriteZeroes(m, off, length)
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// zeroBuf is a shared, never-written buffer of zeroes, aligned for direct I/O.
var zeroBuf = aligned.Make(1 << 20)

// WriteZeroes writes zeroes to [off, off+length) of w, 1 MiB at a time: Trim's fallback for a
// member that cannot release space.
func WriteZeroes(w io.WriterAt, off, length int64) error {
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
