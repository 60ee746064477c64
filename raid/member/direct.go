package member

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/raid5d/raid5d/internal/aligned"
	"golang.org/x/sys/unix"
)

// Direct I/O (package doc # Direct I/O): which members OpenFile opens with O_DIRECT, the
// alignment their I/O needs, and the bounce buffers that carry whatever is not aligned.

// Direct says which members OpenFile opens for direct I/O (O_DIRECT): see SetDirect.
type Direct int32

const (
	// DirectAuto, the default: block devices are opened with O_DIRECT, regular files are not
	// (as qemu's and nbdkit's cache=none do for devices). A block device that refuses O_DIRECT
	// is used through the page cache.
	DirectAuto Direct = iota
	// DirectOn: block devices and regular files alike. A file whose file system refuses
	// O_DIRECT, or whose size is not a multiple of its direct-I/O block, is ErrNoDirect.
	DirectOn
	// DirectOff: every member through the page cache.
	DirectOff
)

func (d Direct) String() string {
	switch d {
	case DirectAuto:
		return "auto"
	case DirectOn:
		return "on"
	case DirectOff:
		return "off"
	}
	return fmt.Sprintf("Direct(%d)", int32(d))
}

// ParseDirect parses auto, on or off (also true and false, as a boolean flag would).
func ParseDirect(s string) (Direct, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return DirectAuto, nil
	case "on", "true", "yes":
		return DirectOn, nil
	case "off", "false", "no":
		return DirectOff, nil
	}
	return 0, fmt.Errorf("want auto, on or off, got %q", s)
}

var directMode atomic.Int32 // a Direct: SetDirect

// SetDirect sets which members OpenFile (and so Open, for a plain path or a kind that wraps
// one) opens for direct I/O from then on; the default is DirectAuto. The program sets it
// before it opens members (cmd/raid5d, from --direct); members already open keep how they
// were opened.
func SetDirect(d Direct) { directMode.Store(int32(d)) }

// DirectMode returns the setting of SetDirect.
func DirectMode() Direct { return Direct(directMode.Load()) }

// wantDirect reports whether OpenFile opens path with O_DIRECT under mode d.
func wantDirect(path string, d Direct) bool {
	if d == DirectOff {
		return false
	}
	fi, err := os.Stat(path)
	if err != nil {
		return false // the open reports it
	}
	if fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
		return true
	}
	return d == DirectOn && fi.Mode().IsRegular()
}

// maxDirectAlign bounds the alignment a direct member may ask for (its bounce buffers are
// made in multiples of it).
const maxDirectAlign = 64 << 10

// directAlign returns the alignment (a power of two) of the memory, offsets and lengths of
// direct I/O on m: what statx reports (STATX_DIOALIGN: the larger of the memory and offset
// alignments), else a block device's logical block size (BLKSSZGET), else a page. ok is false
// when the file's file system says it cannot do direct I/O on it.
func (m *File) directAlign() (align int64, ok bool) {
	var stx unix.Statx_t
	err := retryEINTR(func() error {
		return unix.Statx(m.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx)
	})
	if err == nil && stx.Mask&unix.STATX_DIOALIGN != 0 {
		if stx.Dio_offset_align == 0 { // the file system cannot do direct I/O on this file
			return 0, false
		}
		return int64(max(stx.Dio_mem_align, stx.Dio_offset_align)), true
	}
	if m.block {
		if lbs, err := unix.IoctlGetInt(m.fd, unix.BLKSSZGET); err == nil && lbs > 0 {
			return int64(lbs), true
		}
	}
	return aligned.Align, true
}

// initDirect makes m, opened with O_DIRECT, ready for direct I/O: its alignment, and a probe
// read of its first block, which some file systems refuse (EINVAL) though they accept the
// open. Where direct I/O cannot be done, a DirectAuto member is switched to the page cache
// (fcntl clears O_DIRECT on its open file) and anything else is ErrNoDirect.
func (m *File) initDirect(mode Direct) error {
	align, ok := m.directAlign()
	why := ""
	switch {
	case !ok:
		why = "its file system cannot do direct I/O on it"
	case align&(align-1) != 0 || align > maxDirectAlign:
		why = fmt.Sprintf("its direct-I/O alignment %d is not a power of two up to %d", align, maxDirectAlign)
	case m.size%align != 0:
		why = fmt.Sprintf("its size %d is not a multiple of its direct-I/O block of %d bytes", m.size, align)
	}
	if why == "" && m.size > 0 {
		b := bounceFor(align)
		_, err := m.rawRead((*b)[:align], 0)
		putBounce(b)
		if err != nil {
			why = fmt.Sprintf("a direct read of its first block failed: %v", err)
			if !errors.Is(err, unix.EINVAL) {
				return &os.PathError{Op: "pread O_DIRECT", Path: m.path, Err: err}
			}
		}
	}
	if why == "" {
		m.direct, m.align = true, align
		return nil
	}
	if mode == DirectAuto {
		return m.clearDirect()
	}
	return &os.PathError{Op: "open O_DIRECT", Path: m.path, Err: fmt.Errorf("%w: %s", ErrNoDirect, why)}
}

// clearDirect turns O_DIRECT off on m's open file: it is used through the page cache.
func (m *File) clearDirect() error {
	fl, err := unix.FcntlInt(uintptr(m.fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(m.fd), unix.F_SETFL, fl&^unix.O_DIRECT)
	}
	if err != nil {
		return &os.PathError{Op: "fcntl F_SETFL", Path: m.path, Err: err}
	}
	m.direct, m.align = false, 0
	return nil
}

// Direct reports whether m does direct I/O (O_DIRECT), and the alignment of memory, offset
// and length its I/O calls need; an unaligned call is carried through a bounce buffer.
func (m *File) Direct() (direct bool, align int64) { return m.direct, m.align }

// IsDirect reports whether m, under its wrappers (Base), is a File that does direct I/O: its
// reads and writes wait for the device rather than copy to or from the page cache.
func IsDirect(m Member) bool {
	f, ok := Base(m).(*File)
	return ok && f.direct
}

// Waiter is a Member whose every read and write waits for something far slower than a copy
// through the page cache — a network round trip (raid/member/nbdmember) — so that its
// throughput is bounded by how many requests are in flight to it, not by a CPU.
type Waiter interface {
	// Waits reports whether the member's I/O waits so; it never changes.
	Waits() bool
}

// IsWaiter reports whether m, under its wrappers (Base), is a Waiter that says it waits: the
// array keeps more write-outs and member I/O in flight for an array with such a member.
func IsWaiter(m Member) bool {
	w, ok := Base(m).(Waiter)
	return ok && w.Waits()
}

// Waits reports whether m's reads and writes wait for a device or a network rather than copy
// to or from the page cache: a direct File (IsDirect) or a Waiter (IsWaiter). The array runs
// such members' shares of a batch of writes concurrently rather than one after another.
func Waits(m Member) bool { return IsDirect(m) || IsWaiter(m) }

// Bounced returns how many I/O calls of a direct member went through a bounce buffer because
// their memory, offset or length was not aligned. The array's own buffers are aligned, so it
// counts only requests at odd offsets or of odd sizes; tests check that it stays 0 for the rest.
func (m *File) Bounced() uint64 { return m.bounced.Load() }

// bouncedAll counts the bounced calls of every File of the process (Bounced).
var bouncedAll atomic.Uint64

// Bounced returns how many I/O calls of all direct members of the process went through a
// bounce buffer (File.Bounced, summed; members closed included).
func Bounced() uint64 { return bouncedAll.Load() }

// isAligned reports whether a direct I/O of p at off needs no bounce buffer. Always true for
// a member through the page cache.
func (m *File) isAligned(p []byte, off int64) bool {
	if !m.direct {
		return true
	}
	a := m.align - 1
	return off&a == 0 && int64(len(p))&a == 0 && aligned.Is(p, int(m.align))
}

// vecAligned is isAligned for vectored I/O: every buffer aligned in address and length.
func (m *File) vecAligned(bufs [][]byte, off int64) bool {
	if !m.direct {
		return true
	}
	if off&(m.align-1) != 0 {
		return false
	}
	for _, b := range bufs {
		if !m.isAligned(b, 0) {
			return false
		}
	}
	return true
}

// bounceSize is the size of a bounce buffer: a bounced call is carried in rounds of this many
// bytes.
const bounceSize = 1 << 20

var bounces = sync.Pool{New: func() any { b := aligned.Make(bounceSize); return &b }}

// bounceFor returns a bounce buffer aligned to align (putBounce returns it).
func bounceFor(align int64) *[]byte {
	if align <= aligned.Align {
		return bounces.Get().(*[]byte)
	}
	b := aligned.MakeAligned(bounceSize, int(align))
	return &b
}

func putBounce(b *[]byte) {
	if aligned.Is(*b, aligned.Align) && len(*b) == bounceSize {
		bounces.Put(b)
	}
}

// rawRead reads b at off with pread, retrying EINTR and short reads, until b is full, the end
// of the file, or an error; it returns the bytes read. A direct read returns a count that is
// not a multiple of the block only at the end of the file, which ends it too.
func (m *File) rawRead(b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Pread(m.fd, b[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		n += k
		if k == 0 || (m.direct && int64(k)%m.align != 0) {
			break
		}
	}
	return n, nil
}

// rawWrite writes b at off with pwritev2 (flags: RWF_DSYNC or 0), retrying EINTR and short
// writes.
func (m *File) rawWrite(b []byte, off int64, flags int) error {
	for n := 0; n < len(b); {
		var k int
		var err error
		if flags == 0 {
			k, err = unix.Pwrite(m.fd, b[n:], off+int64(n))
		} else {
			k, err = unix.Pwritev2(m.fd, [][]byte{b[n:]}, off+int64(n), flags)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if k == 0 {
			return unix.EIO // a zero-length write: the device gave up
		}
		n += k
	}
	return nil
}

// bounceRead reads the concatenation of bufs, total bytes, at off of a direct member through
// bounce buffers: the aligned range around each round is read into one, and the bytes asked
// for copied out. It keeps ReadAt's contract: the end of the file before Size is ErrShortRead,
// a read past Size ends at Size with io.EOF (readEnd).
func (m *File) bounceRead(bufs [][]byte, total int, off int64) (int, error) {
	m.bounced.Add(1)
	bouncedAll.Add(1)
	bp := bounceFor(m.align)
	defer putBounce(bp)
	b, a := *bp, m.align
	n := 0
	for n < total {
		pos := off + int64(n)
		lo := pos &^ (a - 1)
		want := min(total-n, len(b)-int(pos-lo))
		hi := (pos + int64(want) + a - 1) &^ (a - 1)
		k, err := m.rawRead(b[:hi-lo], lo)
		got := min(max(k-int(pos-lo), 0), want)
		gather(bufs, n, b[pos-lo:pos-lo+int64(got)], true)
		n += got
		if err != nil {
			return n, &os.PathError{Op: "pread", Path: m.path, Err: err}
		}
		if got < want {
			return n, m.readEnd(off, n, total)
		}
	}
	return n, nil
}

// bounceWrite writes the concatenation of bufs, total bytes, at off of a direct member through
// bounce buffers (flags: pwritev2's, RWF_DSYNC or 0). A block that the range covers only in
// part is read first and written back whole with the new bytes in it; such read-modify-writes
// are serialised (rmwMu), so that two writes to different bytes of one block cannot undo each
// other. The caller has checked the range against Size, which is a multiple of the block.
func (m *File) bounceWrite(bufs [][]byte, total int, off int64, flags int) (int, error) {
	m.bounced.Add(1)
	bouncedAll.Add(1)
	a := m.align
	if off&(a-1) != 0 || int64(total)&(a-1) != 0 {
		m.rmwMu.Lock()
		defer m.rmwMu.Unlock()
	}
	bp := bounceFor(a)
	defer putBounce(bp)
	b := *bp
	n := 0
	for n < total {
		pos := off + int64(n)
		lo := pos &^ (a - 1)
		want := min(total-n, len(b)-int(pos-lo))
		end := pos + int64(want)
		hi := (end + a - 1) &^ (a - 1)
		if pos > lo { // the first block in part: its old bytes around the new
			if err := m.readBlock(b[:a], lo); err != nil {
				return n, err
			}
		}
		if end < hi && (hi-a > lo || pos == lo) { // the last block in part, if not the first
			if err := m.readBlock(b[hi-a-lo:hi-lo], hi-a); err != nil {
				return n, err
			}
		}
		gather(bufs, n, b[pos-lo:end-lo], false)
		if err := m.rawWrite(b[:hi-lo], lo, flags); err != nil {
			return n, &os.PathError{Op: "pwrite", Path: m.path, Err: err}
		}
		n += want
	}
	return n, nil
}

// readBlock reads one whole block of a direct member, within Size, for a read-modify-write.
func (m *File) readBlock(b []byte, off int64) error {
	k, err := m.rawRead(b, off)
	if err != nil {
		return &os.PathError{Op: "pread", Path: m.path, Err: err}
	}
	if k < len(b) {
		return m.shortRead("pread", off, k, len(b))
	}
	return nil
}

// gather copies between b and the concatenation of bufs from its byte skip on: into bufs if
// out, else from them into b.
func gather(bufs [][]byte, skip int, b []byte, out bool) {
	for _, p := range bufs {
		if len(b) == 0 {
			return
		}
		if skip >= len(p) {
			skip -= len(p)
			continue
		}
		var k int
		if out {
			k = copy(p[skip:], b)
		} else {
			k = copy(b, p[skip:])
		}
		b, skip = b[k:], 0
	}
}
