package parity

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// testLengths are chunk lengths the reference tests run: odd sizes catch vector tails.
var testLengths = []int{1, 7, 63, 64, 4095, 4096, 65536 + 3}

// refXOR is the reference parity: a plain byte-by-byte XOR of the data chunks.
func refXOR(data [][]byte) []byte {
	p := make([]byte, len(data[0]))
	for _, d := range data {
		for i := range d {
			p[i] ^= d[i]
		}
	}
	return p
}

// randShards returns data random chunks of n bytes plus a parity chunk of n garbage bytes.
func randShards(rng *rand.Rand, data, n int) [][]byte {
	shards := make([][]byte, data+1)
	for i := range shards {
		shards[i] = make([]byte, n)
		fill(rng, shards[i])
	}
	return shards
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

func clone(shards [][]byte) [][]byte {
	out := make([][]byte, len(shards))
	for i, s := range shards {
		out[i] = bytes.Clone(s)
	}
	return out
}

func mustNew(t testing.TB, data int) *Coder {
	t.Helper()
	c, err := New(data)
	if err != nil {
		t.Fatalf("New(%d): %v", data, err)
	}
	return c
}

// firstDiff returns the index of the first differing byte of a and b, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// forEachShape runs f for 2..15 data chunks and every test length.
func forEachShape(t *testing.T, f func(t *testing.T, c *Coder, rng *rand.Rand, n int)) {
	for data := 2; data <= 15; data++ {
		c := mustNew(t, data)
		for _, n := range testLengths {
			t.Run(fmt.Sprintf("data=%d/len=%d", data, n), func(t *testing.T) {
				f(t, c, rand.New(rand.NewPCG(uint64(data), uint64(n))), n)
			})
		}
	}
}

func TestEncodeIsXOR(t *testing.T) {
	forEachShape(t, func(t *testing.T, c *Coder, rng *rand.Rand, n int) {
		shards := randShards(rng, c.Data(), n)
		before := clone(shards)
		if err := c.Encode(shards); err != nil {
			t.Fatal(err)
		}
		want := refXOR(shards[:c.Data()])
		if i := firstDiff(shards[c.Data()], want); i >= 0 {
			t.Fatalf("parity byte %d = %#x, want %#x", i, shards[c.Data()][i], want[i])
		}
		for i := range c.Data() {
			if !bytes.Equal(shards[i], before[i]) {
				t.Fatalf("Encode wrote data chunk %d", i)
			}
		}
	})
}

func TestReconstructEveryIndex(t *testing.T) {
	forEachShape(t, func(t *testing.T, c *Coder, rng *rand.Rand, n int) {
		good := randShards(rng, c.Data(), n)
		copy(good[c.Data()], refXOR(good[:c.Data()]))
		for missing := 0; missing <= c.Data(); missing++ {
			shards := clone(good)
			fill(rng, shards[missing]) // old contents must be ignored
			if err := c.Reconstruct(shards, missing); err != nil {
				t.Fatalf("missing %d: %v", missing, err)
			}
			for i := range shards {
				if j := firstDiff(shards[i], good[i]); j >= 0 {
					t.Fatalf("missing %d: shard %d byte %d = %#x, want %#x", missing, i, j, shards[i][j], good[i][j])
				}
			}
		}
	})
}

func TestUpdateEveryIndex(t *testing.T) {
	forEachShape(t, func(t *testing.T, c *Coder, rng *rand.Rand, n int) {
		shards := randShards(rng, c.Data(), n)
		copy(shards[c.Data()], refXOR(shards[:c.Data()]))
		for d := range c.Data() {
			old := bytes.Clone(shards[d])
			fill(rng, shards[d])
			newData := bytes.Clone(shards[d])
			if err := c.Update(shards[c.Data()], old, shards[d]); err != nil {
				t.Fatalf("data %d: %v", d, err)
			}
			if !bytes.Equal(shards[d], newData) {
				t.Fatalf("Update wrote the new data of chunk %d", d)
			}
			want := refXOR(shards[:c.Data()])
			if i := firstDiff(shards[c.Data()], want); i >= 0 {
				t.Fatalf("after update of %d: parity byte %d = %#x, want %#x", d, i, shards[c.Data()][i], want[i])
			}
		}
	})
}

func TestVerify(t *testing.T) {
	forEachShape(t, func(t *testing.T, c *Coder, rng *rand.Rand, n int) {
		shards := randShards(rng, c.Data(), n)
		copy(shards[c.Data()], refXOR(shards[:c.Data()]))
		before := clone(shards)
		ok, err := c.Verify(shards)
		if err != nil || !ok {
			t.Fatalf("Verify of a good stripe = %v, %v; want true, nil", ok, err)
		}
		for i := range shards {
			if !bytes.Equal(shards[i], before[i]) {
				t.Fatalf("Verify wrote shard %d", i)
			}
		}
		// One flipped bit anywhere, in any shard, at the start, middle and end, is caught.
		for i := range shards {
			for _, at := range []int{0, n / 2, n - 1} {
				shards[i][at] ^= 0x10
				ok, err := c.Verify(shards)
				shards[i][at] ^= 0x10
				if err != nil || ok {
					t.Fatalf("Verify with shard %d byte %d flipped = %v, %v; want false, nil", i, at, ok, err)
				}
			}
		}
	})
}

func TestNewDataCount(t *testing.T) {
	for _, tc := range []struct {
		data int
		err  error
	}{
		{-1, ErrDataCount},
		{0, ErrDataCount},
		{1, ErrDataCount},
		{MinData, nil},
		{15, nil},
		{MaxData, nil},
		{MaxData + 1, ErrDataCount},
		{256, ErrDataCount},
	} {
		t.Run(fmt.Sprint(tc.data), func(t *testing.T) {
			c, err := New(tc.data)
			if !errors.Is(err, tc.err) {
				t.Fatalf("New(%d) error = %v, want %v", tc.data, err, tc.err)
			}
			if err == nil && c.Data() != tc.data {
				t.Fatalf("Data() = %d, want %d", c.Data(), tc.data)
			}
			if err != nil && c != nil {
				t.Fatalf("New(%d) returned a Coder with an error", tc.data)
			}
		})
	}
}

func TestShapeErrors(t *testing.T) {
	c := mustNew(t, 3)
	mk := func(lens ...int) [][]byte {
		s := make([][]byte, len(lens))
		for i, n := range lens {
			if n >= 0 {
				s[i] = make([]byte, n)
			}
		}
		return s
	}
	for _, tc := range []struct {
		name   string
		shards [][]byte
	}{
		{"nil", nil},
		{"too few", mk(8, 8, 8)},
		{"too many", mk(8, 8, 8, 8, 8)},
		{"zero length", mk(0, 0, 0, 0)},
		{"nil shards", mk(-1, -1, -1, -1)},
		{"short data", mk(8, 7, 8, 8)},
		{"short parity", mk(8, 8, 8, 7)},
		{"long parity", mk(8, 8, 8, 9)},
		{"nil parity", mk(8, 8, 8, -1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Encode(tc.shards); !errors.Is(err, ErrShape) {
				t.Errorf("Encode error = %v, want ErrShape", err)
			}
			if err := c.Reconstruct(tc.shards, 0); !errors.Is(err, ErrShape) {
				t.Errorf("Reconstruct error = %v, want ErrShape", err)
			}
			if ok, err := c.Verify(tc.shards); !errors.Is(err, ErrShape) || ok {
				t.Errorf("Verify = %v, %v, want false, ErrShape", ok, err)
			}
		})
	}
	for _, tc := range []struct {
		name         string
		p, old, new_ []byte
	}{
		{"empty", nil, nil, nil},
		{"short old", make([]byte, 8), make([]byte, 7), make([]byte, 8)},
		{"short new", make([]byte, 8), make([]byte, 8), make([]byte, 7)},
		{"long new", make([]byte, 8), make([]byte, 8), make([]byte, 9)},
		{"empty p", nil, make([]byte, 8), make([]byte, 8)},
	} {
		t.Run("Update/"+tc.name, func(t *testing.T) {
			if err := c.Update(tc.p, tc.old, tc.new_); !errors.Is(err, ErrShape) {
				t.Errorf("Update error = %v, want ErrShape", err)
			}
		})
	}
}

func TestReconstructIndexError(t *testing.T) {
	c := mustNew(t, 3)
	shards := randShards(rand.New(rand.NewPCG(1, 2)), 3, 16)
	before := clone(shards)
	for _, missing := range []int{-1, 4, 5, 1 << 20} {
		if err := c.Reconstruct(shards, missing); !errors.Is(err, ErrIndex) {
			t.Errorf("Reconstruct(missing=%d) error = %v, want ErrIndex", missing, err)
		}
	}
	for i := range shards {
		if !bytes.Equal(shards[i], before[i]) {
			t.Fatalf("a refused Reconstruct wrote shard %d", i)
		}
	}
}

// TestNoAllocs checks that the hot-path methods allocate nothing, for data counts on both
// sides of the library's 10-input kernel limit and for short and long chunks.
func TestNoAllocs(t *testing.T) {
	for _, data := range []int{2, 3, 4, 10, 11, 15, MaxData} {
		for _, n := range []int{7, 4096, 64 << 10} {
			t.Run(fmt.Sprintf("data=%d/len=%d", data, n), func(t *testing.T) {
				c := mustNew(t, data)
				shards := randShards(rand.New(rand.NewPCG(5, 6)), data, n)
				old := bytes.Clone(shards[0])
				for _, tc := range []struct {
					name string
					f    func()
				}{
					{"Encode", func() { _ = c.Encode(shards) }},
					{"Reconstruct/data", func() { _ = c.Reconstruct(shards, 0) }},
					{"Reconstruct/last-data", func() { _ = c.Reconstruct(shards, data-1) }},
					{"Reconstruct/parity", func() { _ = c.Reconstruct(shards, data) }},
					{"Update", func() { _ = c.Update(shards[data], old, shards[0]) }},
					{"Verify", func() { _, _ = c.Verify(shards) }},
				} {
					if a := testing.AllocsPerRun(20, tc.f); a != 0 {
						t.Errorf("%s allocates %v per call, want 0", tc.name, a)
					}
				}
			})
		}
	}
}

// TestXorInto checks the one-pass XOR against the byte-by-byte reference for every length up
// to a few blocks (the vector kernel's 256-byte blocks and the pairwise tail), 2 to MaxData+1
// sources, sources longer than dst, and dst as the first source (Update's p ^= old ^ new).
func TestXorInto(t *testing.T) {
	if !haveBlocks {
		t.Log("no vector kernel on this CPU: the pairwise path is what is tested")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, k := range []int{2, 3, 4, 5, 9, MaxData + 1} {
		for n := 1; n <= 3*blockSize+17; n += 1 + n/16 {
			srcs := make([][]byte, k)
			for i := range srcs {
				srcs[i] = make([]byte, n+rng.IntN(3)*blockSize) // longer: only [:n] counts
				fill(rng, srcs[i])
			}
			want := make([]byte, n)
			for _, s := range srcs {
				for i := range want {
					want[i] ^= s[i]
				}
			}
			dst := make([]byte, n)
			fill(rng, dst) // its old contents must not matter
			xorInto(dst, srcs)
			if i := firstDiff(dst, want); i >= 0 {
				t.Fatalf("%d sources, %d bytes: byte %d differs", k, n, i)
			}
			// In place: dst is the first source.
			first := bytes.Clone(srcs[0][:n])
			in := srcs[0][:n]
			xorInto(in, srcs)
			if i := firstDiff(in, want); i >= 0 {
				t.Fatalf("%d sources, %d bytes, dst as the first source: byte %d differs", k, n, i)
			}
			copy(srcs[0], first)
		}
	}
}
