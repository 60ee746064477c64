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
	"testing"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/stripe"
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

// TestModel drives arrays of 3, 4 and 5 members in every layout with concurrent random reads,
// writes, trims and zeroes, checked against a plain []byte; then, for every role in turn,
// removes that member, assembles degraded, compares every byte, writes more and compares again.
// After each phase every member byte is checked against the model: data chunks equal the
// model's bytes and every parity chunk equals the XOR of its stripe's data.
func TestModel(t *testing.T) {
	for _, n := range []int{3, 4, 5} {
		for li, alg := range layouts {
			chunk := int64(4 << 10)
			if (n+li)%2 == 1 {
				chunk = 8 << 10
			}
			t.Run(fmt.Sprintf("n%d-%s-c%dk", n, alg, chunk>>10), func(t *testing.T) {
				t.Parallel()
				testModel(t, n, chunk, alg, uint64(n*10+li))
			})
		}
	}
}

func testModel(t *testing.T, n int, chunk int64, alg stripe.Algorithm, seed uint64) {
	const stripes = 24
	dir := t.TempDir()
	paths := memberPaths(dir, n)
	layout, err := stripe.NewLayout(n, chunk, alg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, Layout: alg.String(),
		MemberSize: raid.DataOffset + stripes*chunk})
	if err != nil {
		t.Fatal(err)
	}
	size, _ := a.Size()
	if want := stripes * layout.StripeSize(); size != want {
		t.Fatalf("Size = %d, want %d", size, want)
	}
	model := make([]byte, size)
	exercise(t, a, model, seed, 120)
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
			ddir := t.TempDir()
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
			a, err := raid.Assemble(rev, raid.AssembleOptions{})
			if err != nil {
				t.Fatalf("Assemble degraded: %v", err)
			}
			st := a.Status()
			if st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != missing {
				t.Fatalf("Status = %v, missing %v; want degraded, missing [%d]", st.State, st.Missing, missing)
			}
			dmodel := bytes.Clone(model)
			compareArray(t, a, dmodel)
			exercise(t, a, dmodel, seed*100+uint64(missing), 60)
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
func exercise(t *testing.T, a *raid.Array, model []byte, seed uint64, ops int) {
	t.Helper()
	const workers = 4
	ss := a.Layout().StripeSize()
	slot := 2*ss + 1536 + 7
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
					p := buf[:n]
					fill(rng, p)
					if m, err := a.WriteAt(p, off); err != nil || m != int(n) {
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
