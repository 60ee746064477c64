package member

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/internal/looptest"
	"golang.org/x/sys/unix"
)

// setDirect sets SetDirect's mode for the test, restoring the old one after it.
func setDirect(t *testing.T, d Direct) {
	old := DirectMode()
	SetDirect(d)
	t.Cleanup(func() { SetDirect(old) })
}

// directImage creates a sparse file of size bytes for a direct member test.
func directImage(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "direct.img")
	if err := CreateFile(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

// loopDevice attaches img to a free loop device with direct I/O on (with sectorSize > 0 that
// logical block size), detached when the test ends. It skips the test when loop devices
// cannot be attached here (not root, no loop driver).
func loopDevice(t *testing.T, img string, sectorSize int) string {
	t.Helper()
	dev, err := looptest.Attach(t, img, looptest.Options{DirectIO: true, SectorSize: sectorSize})
	if err != nil {
		t.Skip(err)
	}
	return dev
}

// directTargets are the direct members the direct I/O tests run on: a file on the test's
// temporary directory (opened with DirectOn), a loop device of 512-byte blocks and one of
// 4096-byte blocks (DirectAuto), each size bytes.
func directTargets(size int64) map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"file": func(t *testing.T) string {
			setDirect(t, DirectOn)
			return directImage(t, size)
		},
		"loop512": func(t *testing.T) string {
			setDirect(t, DirectAuto)
			return loopDevice(t, directImage(t, size), 512)
		},
		"loop4096": func(t *testing.T) string {
			setDirect(t, DirectAuto)
			return loopDevice(t, directImage(t, size), 4096)
		},
	}
}

// openDirect opens path as a direct member, failing the test if it is not direct.
func openDirect(t *testing.T, path string) *File {
	t.Helper()
	m, err := OpenFile(path, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if d, a := m.Direct(); !d || a < 512 || a&(a-1) != 0 {
		t.Fatalf("%s: Direct() = %v, %d; want direct with a power-of-two block", path, d, a)
	}
	return m
}

// TestDirectIO: reads and writes of a direct member at every kind of alignment — aligned in
// memory, offset and length, or not in any of them, of odd sizes up to past two bounce
// buffers, single and vectored, plain and RWF_DSYNC — read back every byte as a model says.
// Aligned calls go to the device as they are (Bounced unchanged); the others go through a
// bounce buffer, once each: without it O_DIRECT refuses them (EINVAL).
func TestDirectIO(t *testing.T) {
	const size = 8 << 20
	for name, target := range directTargets(size) {
		t.Run(name, func(t *testing.T) {
			path := target(t)
			m := openDirect(t, path)
			_, align := m.Direct()
			t.Logf("%s: direct, block %d", path, align)
			model := make([]byte, size)
			rng := rand.New(rand.NewPCG(uint64(align), 7))
			pool := aligned.Make(maxOpLen + 16*int(align)) // memory the calls' buffers are cut from
			for i := range 400 {
				op := directOp(rng, align, size, i)
				bufs := op.buffers(rng, pool, align)
				before := m.Bounced()
				var n int
				var err error
				if op.write {
					for _, b := range bufs {
						for j := range b {
							b[j] = byte(rng.Uint32() | 1)
						}
					}
					switch op.call {
					case 0:
						n, err = m.WriteAt(bufs[0], op.off)
					case 1:
						n, err = m.WritevAt(bufs, op.off, make([]unix.Iovec, 0, len(bufs)))
					case 2:
						n, err = m.WriteAtDSync(bufs[0], op.off)
					}
				} else {
					switch op.call {
					case 0, 2:
						n, err = m.ReadAt(bufs[0], op.off)
					case 1:
						n, err = m.ReadvAt(bufs, op.off, make([]unix.Iovec, 0, len(bufs)))
					}
				}
				if err != nil || n != op.n {
					t.Fatalf("%v: n = %d, err = %v; want %d, nil", op, n, err, op.n)
				}
				if want := before + uint64(btoi(!op.aligned)); m.Bounced() != want {
					t.Fatalf("%v: Bounced went from %d to %d, want %d", op, before, m.Bounced(), want)
				}
				at := op.off
				for _, b := range bufs {
					if op.write {
						copy(model[at:], b)
					} else if !bytes.Equal(b, model[at:at+int64(len(b))]) {
						t.Fatalf("%v: read back %s", op, firstDiff(b, model[at:]))
					}
					at += int64(len(b))
				}
			}
			if err := m.Sync(); err != nil {
				t.Fatal(err)
			}
			got := aligned.Make(size)
			if _, err := m.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, model) {
				t.Fatalf("whole member: %s", firstDiff(got, model))
			}
			// And through the page cache, as another program sees the member.
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, model) {
				t.Fatalf("whole member, read through the page cache: %s", firstDiff(got, model))
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ioOp is one call of TestDirectIO.
type ioOp struct {
	write   bool
	call    int // 0 ReadAt/WriteAt, 1 vectored, 2 WriteAtDSync (a read: ReadAt)
	off     int64
	n       int
	mem     int // the first buffer's offset from an aligned address
	aligned bool
}

func (op ioOp) String() string {
	return fmt.Sprintf("write %v call %d at %d, %d bytes, memory +%d (aligned %v)", op.write, op.call, op.off, op.n, op.mem, op.aligned)
}

// maxOpLen is the longest call of TestDirectIO: past two bounce buffers.
const maxOpLen = 2*bounceSize + 5000

// directOp picks the i-th call: every third one aligned in memory, offset and length, the
// rest misaligned in one, two or all three of them, some longer than two bounce buffers.
func directOp(rng *rand.Rand, align, size int64, i int) ioOp {
	op := ioOp{write: i%2 == 0, call: i / 2 % 3, aligned: i%3 == 0}
	maxLen := int64(64 << 10)
	if i%10 == 9 {
		maxLen = maxOpLen
	}
	if op.aligned {
		op.n = int(align * (1 + rng.Int64N(maxLen/align)))
		op.off = align * rng.Int64N((size-int64(op.n))/align+1)
		return op
	}
	op.n = 1 + int(rng.Int64N(maxLen))
	op.off = rng.Int64N(size - int64(op.n) + 1)
	op.mem = rng.IntN(int(align))
	switch rng.IntN(4) { // some misaligned only in memory, or only in offset and length
	case 0:
		op.n = int(align * (1 + rng.Int64N(maxLen/align)))
		op.off = align * rng.Int64N((size-int64(op.n))/align+1)
		op.mem = 1 + rng.IntN(int(align)-1)
	case 1:
		op.mem = 0
		if op.off%align == 0 && int64(op.n)%align == 0 {
			op.off++
		}
	}
	if op.off+int64(op.n) > size {
		op.off = size - int64(op.n)
	}
	op.aligned = op.off%align == 0 && int64(op.n)%align == 0 && op.mem == 0
	return op
}

// buffers cuts op's buffers from pool: one, or for a vectored call up to four that split the
// range (each of a multiple of the block when op is aligned), the first at op.mem from an
// aligned address, the others each aligned or not as op is.
func (op ioOp) buffers(rng *rand.Rand, pool []byte, align int64) [][]byte {
	cuts := []int{0, op.n}
	if op.call == 1 && op.n > 1 {
		for range rng.IntN(4) {
			c := 1 + rng.IntN(op.n-1)
			if op.aligned {
				c = int(int64(c) / align * align)
			}
			cuts = append(cuts, c)
		}
	}
	cuts = sortedUnique(cuts)
	var bufs [][]byte
	at := op.mem
	for i := 1; i < len(cuts); i++ {
		n := cuts[i] - cuts[i-1]
		if n == 0 {
			continue
		}
		bufs = append(bufs, pool[at:at+n:at+n])
		at = (at + n + int(align) - 1) / int(align) * int(align)
		if !op.aligned && rng.IntN(2) == 0 {
			at += 1 + rng.IntN(int(align)-1)
		}
	}
	return bufs
}

func sortedUnique(s []int) []int {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	out := s[:1]
	for _, v := range s[1:] {
		if v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}

func firstDiff(got, want []byte) string {
	for i := range got {
		if i >= len(want) || got[i] != want[i] {
			return fmt.Sprintf("byte %d of %d is %#x, want %#x", i, len(got), got[i], want[min(i, len(want)-1)])
		}
	}
	return "equal"
}

// TestDirectPartialBlocks: concurrent bounced writes to different bytes of the same blocks
// (each a read-modify-write of the whole block) leave every byte as its own writer last
// wrote it: one writer's read-modify-write never puts back another's old bytes.
func TestDirectPartialBlocks(t *testing.T) {
	setDirect(t, DirectOn)
	const blocks, writers, rounds = 8, 8, 30
	m := openDirect(t, directImage(t, 1<<20))
	_, align := m.Direct()
	piece := int(align) / writers
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				p := bytes.Repeat([]byte{byte(w*rounds + r + 1)}, piece)
				for b := range blocks {
					if _, err := m.WriteAt(p, int64(b)*align+int64(w*piece)); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	got := aligned.Make(blocks * int(align))
	if _, err := m.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i, c := range got {
		if w := i % int(align) / piece; c != byte(w*rounds+rounds) {
			t.Fatalf("byte %d (writer %d) is %d, want its last write %d", i, w, c, w*rounds+rounds)
		}
	}
}

// TestDirectEnds: a direct member keeps ReadAt's contract at its ends: a read across Size
// returns the bytes up to it and io.EOF, a write past it is refused, and once the file is
// truncated under it (at a block boundary or not) a read of what is gone is ErrShortRead.
func TestDirectEnds(t *testing.T) {
	setDirect(t, DirectOn)
	const size = 1 << 20
	path := directImage(t, size)
	m := openDirect(t, path)
	p := make([]byte, 10000)
	if n, err := m.ReadAt(p, size-100); n != 100 || !errors.Is(err, io.EOF) {
		t.Fatalf("read across the end = %d, %v; want 100, EOF", n, err)
	}
	if _, err := m.WriteAt(p[:200], size-100); err == nil {
		t.Fatal("a write past the member's end must fail")
	}
	for _, cut := range []int64{size - 8192, size - 5000} {
		if err := os.Truncate(path, cut); err != nil {
			t.Fatal(err)
		}
		for _, off := range []int64{size - 16384, size - 12000, size - 8192} {
			if off+int64(len(p)) <= cut {
				continue // all there
			}
			if _, err := m.ReadAt(p, off); !errors.Is(err, ErrShortRead) {
				t.Fatalf("truncated to %d: read at %d: %v, want ErrShortRead", cut, off, err)
			}
		}
	}
}

// TestDirectModes: which members each mode opens direct (auto: block devices only; on: files
// too; off: none), and that a direct member has no mapping for mapped reads and writes (they
// would go through the page cache it bypasses) while a buffered one has.
func TestDirectModes(t *testing.T) {
	img := directImage(t, 1<<20)
	dev := loopDevice(t, directImage(t, 1<<20), 0)
	for _, c := range []struct {
		mode                  Direct
		fileDirect, devDirect bool
	}{{DirectAuto, false, true}, {DirectOn, true, true}, {DirectOff, false, false}} {
		SetDirect(c.mode)
		for _, x := range []struct {
			path string
			want bool
		}{{img, c.fileDirect}, {dev, c.devDirect}} {
			m, err := OpenFile(x.path, Exclusive)
			if err != nil {
				SetDirect(DirectAuto)
				t.Fatal(err)
			}
			if d, _ := m.Direct(); d != x.want || (m.Mapping() == nil) != x.want {
				t.Errorf("--direct=%v %s: Direct() %v, mapped %v; want direct %v and a mapping only if not",
					c.mode, x.path, d, m.Mapping() != nil, x.want)
			}
			if x.want && m.WritableRange(0, 4096) != nil {
				t.Errorf("--direct=%v %s: a direct member has a writable range", c.mode, x.path)
			}
			m.Close()
		}
	}
	SetDirect(DirectAuto)
	for s, want := range map[string]Direct{"auto": DirectAuto, "on": DirectOn, "off": DirectOff, "true": DirectOn} {
		if d, err := ParseDirect(s); err != nil || d != want || (s != "true" && d.String() != s) {
			t.Errorf("ParseDirect(%q) = %v, %v", s, d, err)
		}
	}
	if _, err := ParseDirect("sometimes"); err == nil {
		t.Error("ParseDirect accepted sometimes")
	}
}

// TestNoDirect: a file that cannot do direct I/O under DirectOn is ErrNoDirect in an
// *os.PathError naming it: a file system that refuses O_DIRECT at the open (as tmpfs did
// before Linux 6.6; simulated), and a file whose size is not a multiple of its block. Under
// DirectAuto a block device whose open refuses O_DIRECT is used through the page cache.
func TestNoDirect(t *testing.T) {
	setDirect(t, DirectOn)
	refuse := func(name string, flag int, perm os.FileMode) (*os.File, error) {
		if flag&unix.O_DIRECT != 0 {
			return nil, &os.PathError{Op: "open", Path: name, Err: unix.EINVAL}
		}
		return os.OpenFile(name, flag, perm)
	}
	img := directImage(t, 1<<20)
	openFunc = refuse
	_, err := OpenFile(img, Exclusive)
	openFunc = os.OpenFile
	var pe *os.PathError
	if !errors.Is(err, ErrNoDirect) || !errors.As(err, &pe) || pe.Path != img {
		t.Fatalf("a file system refusing O_DIRECT: %v, want ErrNoDirect naming %s", err, img)
	}
	t.Log(err)

	odd := directImage(t, 1<<20+100)
	_, err = OpenFile(odd, Exclusive)
	if !errors.Is(err, ErrNoDirect) || !errors.As(err, &pe) || pe.Path != odd {
		t.Fatalf("a file of %d bytes: %v, want ErrNoDirect naming %s", 1<<20+100, err, odd)
	}
	t.Log(err)

	SetDirect(DirectAuto)
	dev := loopDevice(t, directImage(t, 1<<20), 0)
	openFunc = refuse
	m, err := OpenFile(dev, Exclusive)
	openFunc = os.OpenFile
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if d, _ := m.Direct(); d {
		t.Fatal("a device that refused O_DIRECT under auto is direct")
	}
}
