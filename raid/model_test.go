package raid_test

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/stripe"
	"golang.org/x/sys/unix"
)

var layouts = []stripe.Algorithm{stripe.LeftAsymmetric, stripe.RightAsymmetric, stripe.LeftSymmetric, stripe.RightSymmetric}

// memberPaths returns n member paths in dir.
func memberPaths(dir string, n int) []string {
	paths := make([]string, n)
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("m%d.img", i))
	}
	return paths
}

// ioMode is a way of writing to an array: its I/O options, and whether writes go through
// WritePinned.
type ioMode struct {
	name   string
	io     raid.IOOptions
	pinned bool
	shm    bool // member files on tmpfs (modeDir)
}

// modeDir returns a temporary directory for mode's member files: on tmpfs (/dev/shm) for a
// mode that asks for it, where the machine has one, else t.TempDir().
func modeDir(t testing.TB, mode ioMode) string {
	t.Helper()
	var fs unix.Statfs_t
	if !mode.shm || unix.Statfs("/dev/shm", &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp("/dev/shm", "raid5d-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// ioModes are the modes every data test runs in: the write-back cache copying (the default),
// with stable pages, with stable pages and pinned buffers, with a cache of two stripes (constant
// eviction and write-through), and with no write-back caching (StripeCache -1: a cache of no
// heads, every partial write written through before it returns); reads through the members'
// mappings (MappedReads) with the mappings writable (MappedWrites) in the stable and
// write-through modes, as the daemon does by default, on a disk's filesystem and on tmpfs.
var ioModes = []ioMode{
	{name: "copy"},
	{name: "stable", io: raid.IOOptions{StablePages: true, MappedReads: true, MappedWrites: true}},
	{name: "pinned", io: raid.IOOptions{StablePages: true}, pinned: true},
	{name: "tiny-cache", io: raid.IOOptions{StripeCache: 2, WriteBackDelay: time.Millisecond}},
	{name: "write-through", io: raid.IOOptions{StripeCache: -1, MappedReads: true, MappedWrites: true}, shm: true},
}

// TestModel drives arrays of 3, 4 and 5 members in every layout with concurrent random reads,
// writes, trims and zeroes, checked against a plain []byte; then, for every role in turn,
// removes that member, assembles degraded, compares every byte, writes more and compares again.
// After each phase every member byte is checked against the model: data chunks equal the
// model's bytes and every parity chunk equals the XOR of its stripe's data. The default mode
// (copy) runs every layout; the other modes one layout per member count.
func TestModel(t *testing.T) {
	for _, mode := range ioModes {
		for _, n := range []int{3, 4, 5} {
			for li, alg := range layouts {
				if mode.name != "copy" && li != n%len(layouts) {
					continue
				}
				chunk := int64(4 << 10)
				if (n+li)%2 == 1 {
					chunk = 8 << 10
				}
				t.Run(fmt.Sprintf("%s-n%d-%s-c%dk", mode.name, n, alg, chunk>>10), func(t *testing.T) {
					t.Parallel()
					testModel(t, n, chunk, alg, uint64(n*10+li), mode)
				})
			}
		}
	}
}

func testModel(t *testing.T, n int, chunk int64, alg stripe.Algorithm, seed uint64, mode ioMode) {
	const stripes = 24
	dir := modeDir(t, mode)
	paths := memberPaths(dir, n)
	layout, err := stripe.NewLayout(n, chunk, alg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, Layout: alg.String(),
		MemberSize: raid.DataOffset + stripes*chunk, IOOptions: mode.io})
	if err != nil {
		t.Fatal(err)
	}
	size, _ := a.Size()
	if want := stripes * layout.StripeSize(); size != want {
		t.Fatalf("Size = %d, want %d", size, want)
	}
	model := make([]byte, size)
	exercise(t, a, model, seed, 120, mode.pinned)
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkMembers(t, paths, layout, model, -1)
	rep, err := raid.Examine(paths)
	if err != nil || rep.State != raid.StateClean {
		t.Fatalf("Examine after Close: state %v, err %v; want clean", rep.State, err)
	}

	for missing := range n {
		t.Run(fmt.Sprintf("without-role-%d", missing), func(t *testing.T) {
			ddir := modeDir(t, mode)
			dpaths := memberPaths(ddir, n)
			for i := range n {
				copyFile(t, paths[i], dpaths[i])
			}
			os.Remove(dpaths[missing])
			// Any order: reverse the paths.
			rev := make([]string, n)
			for i := range n {
				rev[i] = dpaths[n-1-i]
			}
			a, err := raid.Assemble(rev, raid.AssembleOptions{IOOptions: mode.io})
			if err != nil {
				t.Fatalf("Assemble degraded: %v", err)
			}
			st := a.Status()
			if st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != missing {
				t.Fatalf("Status = %v, missing %v; want degraded, missing [%d]", st.State, st.Missing, missing)
			}
			dmodel := bytes.Clone(model)
			compareArray(t, a, dmodel)
			exercise(t, a, dmodel, seed*100+uint64(missing), 60, mode.pinned)
			compareArray(t, a, dmodel)
			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			checkMembers(t, dpaths, layout, dmodel, missing)
			// Again, read-only: the state was recorded consistently.
			a, err = raid.Assemble(dpaths, raid.AssembleOptions{ReadOnly: true})
			if err != nil {
				t.Fatalf("second degraded Assemble: %v", err)
			}
			compareArray(t, a, dmodel)
			a.Close()
		})
	}
}

// exercise runs 4 goroutines of ops random operations each. The array is cut into slots of
// a little over two stripes, owned round-robin by the goroutines, so each goroutine's model
// bytes are its own while neighbouring slots share stripes (exercising the stripe locks).
// With pinned, writes go through WritePinned, each from a buffer of its own that its release
// function checks is released once and then scribbles over, so that any read of it after
// release shows up as wrong data; every release must have run after the final Flush.
func exercise(t *testing.T, a *raid.Array, model []byte, seed uint64, ops int, pinned bool) {
	t.Helper()
	var outstanding sync.WaitGroup
	defer func() {
		done := make(chan struct{})
		go func() { outstanding.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("WritePinned buffers still not released after Flush")
		}
	}()
	write := func(p []byte, off int64) (int, error) {
		if !pinned {
			return a.WriteAt(p, off)
		}
		q := bytes.Clone(p)
		var calls atomic.Int32
		outstanding.Add(1)
		return a.WritePinned(q, off, func() {
			if calls.Add(1) != 1 {
				t.Errorf("WritePinned(%d, %d): release called twice", off, len(q))
				return
			}
			for i := range q {
				q[i] = 0xee
			}
			outstanding.Done()
		})
	}
	const workers = 4
	ss := a.Layout().StripeSize()
	slot := 3*ss + 1536 + 7 // room for a write of two or three whole stripes
	size := int64(len(model))
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			var mine []int64 // slot starts
			for s, i := int64(0), 0; s < size; s, i = s+slot, i+1 {
				if i%workers == g {
					mine = append(mine, s)
				}
			}
			buf := make([]byte, slot)
			for range ops {
				start := mine[rng.IntN(len(mine))]
				end := min(start+slot, size)
				off, n := randRange(rng, start, end, a.Layout().ChunkSize())
				switch k := rng.IntN(20); {
				case k < 9:
					if k == 0 { // whole stripes from the slot's first stripe boundary: written as one batch
						off = (start + ss - 1) / ss * ss
						n = (end - off) / ss * ss
					}
					p := buf[:n]
					fill(rng, p)
					if m, err := write(p, off); err != nil || m != int(n) {
						t.Errorf("WriteAt(%d, %d) = %d, %v", off, n, m, err)
						return
					}
					copy(model[off:], p)
				case k < 14:
					p := buf[:n]
					if m, err := a.ReadAt(p, off); err != nil || m != int(n) {
						t.Errorf("ReadAt(%d, %d) = %d, %v", off, n, m, err)
						return
					}
					if !bytes.Equal(p, model[off:off+n]) {
						t.Errorf("ReadAt(%d, %d): data differs from the model at %d", off, n, off+int64(firstDiff(p, model[off:])))
						return
					}
				case k < 17:
					if err := a.Trim(off, n); err != nil {
						t.Errorf("Trim(%d, %d): %v", off, n, err)
						return
					}
					clear(model[off : off+n])
				default:
					if err := a.WriteZeroes(off, n, k == 19); err != nil {
						t.Errorf("WriteZeroes(%d, %d): %v", off, n, err)
						return
					}
					clear(model[off : off+n])
				}
			}
		})
	}
	wg.Wait()
	if err := a.Flush(); err != nil {
		t.Errorf("Flush: %v", err)
	}
}

// randRange picks a range in [start, end): a third chunk-aligned, a third 512-aligned, a third
// anywhere, of lengths from one byte to the whole slot.
func randRange(rng *rand.Rand, start, end, chunk int64) (off, n int64) {
	align := []int64{chunk, 512, 1}[rng.IntN(3)]
	lo := (start + align - 1) / align * align
	if lo >= end {
		lo = start
		align = 1
	}
	off = lo + rng.Int64N((end-lo+align-1)/align)*align
	if off >= end {
		off = lo
	}
	maxN := end - off
	switch rng.IntN(3) {
	case 0:
		n = 1 + rng.Int64N(min(maxN, 600))
	default:
		n = 1 + rng.Int64N(maxN)
		if align > 1 && n >= align {
			n = n / align * align
		}
	}
	return off, n
}

func fill(rng *rand.Rand, p []byte) {
	for i := 0; i < len(p); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(p); j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// compareArray reads the whole array, in one call and then in odd-sized pieces, and compares
// every byte with the model.
func compareArray(t *testing.T, a *raid.Array, model []byte) {
	t.Helper()
	got := make([]byte, len(model))
	if n, err := a.ReadAt(got, 0); err != nil || n != len(got) {
		t.Fatalf("ReadAt(whole array) = %d, %v", n, err)
	}
	if i := firstDiff(got, model); i < len(model) {
		t.Fatalf("array differs from the model at byte %d (of %d)", i, len(model))
	}
	clear(got)
	const piece = 12345
	for off := 0; off < len(got); off += piece {
		end := min(off+piece, len(got))
		if n, err := a.ReadAt(got[off:end], int64(off)); err != nil || n != end-off {
			t.Fatalf("ReadAt(%d, %d) = %d, %v", off, end-off, n, err)
		}
	}
	if i := firstDiff(got, model); i < len(model) {
		t.Fatalf("array (read in pieces) differs from the model at byte %d", i)
	}
}

// checkMembers reads the member files directly and checks every data chunk against the model
// and every parity chunk against the XOR of the model's data for its stripe. The member at
// role missing (if ≥ 0) is not read.
func checkMembers(t *testing.T, paths []string, layout stripe.Layout, model []byte, missing int) {
	t.Helper()
	C := layout.ChunkSize()
	stripes := int64(len(model)) / layout.StripeSize()
	files := make([][]byte, len(paths))
	for r, p := range paths {
		if r == missing {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[r] = b
	}
	P := make([]byte, C)
	for s := range stripes {
		clear(P)
		moff := raid.DataOffset + s*C
		for d := range layout.DataMembers() {
			want := model[(s*int64(layout.DataMembers())+int64(d))*C:][:C]
			subtle.XORBytes(P, P, want)
			r := layout.DataMember(s, d)
			if files[r] != nil && !bytes.Equal(files[r][moff:moff+C], want) {
				t.Fatalf("stripe %d data chunk %d (role %d) differs from the model at byte %d", s, d, r, firstDiff(files[r][moff:], want))
			}
		}
		if r := layout.ParityMember(s); files[r] != nil && !bytes.Equal(files[r][moff:moff+C], P) {
			t.Fatalf("stripe %d: parity (role %d) is not the XOR of the data", s, r)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// writeModel fills a model of the whole array from seed, writes it at offset 0 and returns it.
func writeModel(t testing.TB, a *raid.Array, seed uint64) []byte {
	t.Helper()
	model := make([]byte, mustSize(a))
	fill(newRand(seed), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	return model
}
