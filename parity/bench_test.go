package parity

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/reedsolomon"
)

// Benchmarks are named by configuration: data chunks per stripe and chunk size. SetBytes is the
// data a call reads (Data()×chunk; one chunk for Update), so MB/s compare directly with
// BenchmarkCopy of the same bytes.

var benchConfigs = func() (cs []struct{ data, chunk int }) {
	for _, data := range []int{3, 4, 7} {
		for _, chunk := range []int{4 << 10, 64 << 10, 1 << 20} {
			cs = append(cs, struct{ data, chunk int }{data, chunk})
		}
	}
	return cs
}()

func benchName(data, chunk int) string {
	if chunk >= 1<<20 {
		return fmt.Sprintf("data=%d/chunk=%dM", data, chunk>>20)
	}
	return fmt.Sprintf("data=%d/chunk=%dK", data, chunk>>10)
}

func benchStripes(b *testing.B, f func(b *testing.B, c *Coder, shards [][]byte)) {
	for _, cfg := range benchConfigs {
		b.Run(benchName(cfg.data, cfg.chunk), func(b *testing.B) {
			c := mustNew(b, cfg.data)
			shards := randShards(rand.New(rand.NewPCG(7, 8)), cfg.data, cfg.chunk)
			if err := c.Encode(shards); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(cfg.data * cfg.chunk))
			f(b, c, shards)
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	benchStripes(b, func(b *testing.B, c *Coder, shards [][]byte) {
		for b.Loop() {
			if err := c.Encode(shards); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReconstruct rebuilds data chunk 0 from the others (Data() chunks read).
func BenchmarkReconstruct(b *testing.B) {
	benchStripes(b, func(b *testing.B, c *Coder, shards [][]byte) {
		for b.Loop() {
			if err := c.Reconstruct(shards, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	benchStripes(b, func(b *testing.B, c *Coder, shards [][]byte) {
		for b.Loop() {
			if ok, err := c.Verify(shards); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
}

// BenchmarkUpdate folds one chunk's change into P; SetBytes is one chunk.
func BenchmarkUpdate(b *testing.B) {
	benchStripes(b, func(b *testing.B, c *Coder, shards [][]byte) {
		b.SetBytes(int64(len(shards[0])))
		p, old, new := shards[c.Data()], shards[0], shards[1]
		for b.Loop() {
			if err := c.Update(p, old, new); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCopy is copy() of the same bytes as Encode reads, for scale.
func BenchmarkCopy(b *testing.B) {
	for _, cfg := range benchConfigs {
		b.Run(benchName(cfg.data, cfg.chunk), func(b *testing.B) {
			src := make([]byte, cfg.data*cfg.chunk)
			dst := make([]byte, len(src))
			fill(rand.New(rand.NewPCG(7, 8)), src)
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

// BenchmarkLibraryEncode is reedsolomon's own one-pass Encode with New's options, which the
// Coder does not use because it allocates per call: the price of allocation-free Encode.
func BenchmarkLibraryEncode(b *testing.B) {
	benchStripes(b, func(b *testing.B, c *Coder, shards [][]byte) {
		enc, err := reedsolomon.New(c.Data(), 1,
			reedsolomon.WithFastOneParityMatrix(), reedsolomon.WithMaxGoroutines(1))
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := enc.Encode(shards); err != nil {
				b.Fatal(err)
			}
		}
	})
}
