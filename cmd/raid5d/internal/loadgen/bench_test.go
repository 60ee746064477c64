package loadgen

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// BenchmarkStamp is the generator's cost per written block as Run pays it: a header and a
// 28-byte CRC update per 4 KiB unit, in place in the pool.
func BenchmarkStamp(b *testing.B) {
	for _, bs := range []int{4096, 1 << 20} {
		b.Run(sizeName(bs), func(b *testing.B) {
			p := NewPool(DefaultPoolSize, Unit(bs), 1)
			per := bs / Unit(bs)
			b.SetBytes(int64(bs))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p.Stamp(i*per%(p.Units()-per+1), bs, Header{Gen: uint32(i), Offset: int64(i) * int64(bs), Seed: 1})
			}
		})
	}
}

// BenchmarkFill is the copying variant: copy from the pool into a buffer and stamp a header
// per 4 KiB (the payload CRC is precomputed).
func BenchmarkFill(b *testing.B) {
	for _, bs := range []int{4096, 1 << 20} {
		b.Run(sizeName(bs), func(b *testing.B) {
			p := NewPool(DefaultPoolSize, Unit(bs), 1)
			buf := make([]byte, bs)
			pos := 0
			b.SetBytes(int64(bs))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				pos = p.Fill(buf, pos, Header{Gen: uint32(i), Offset: int64(i) * int64(bs), Seed: 1})
			}
		})
	}
}

// BenchmarkFillFullCRC is what Fill would cost computing each unit's CRC-32C in full instead
// of from the precomputed payload CRC.
func BenchmarkFillFullCRC(b *testing.B) {
	p := NewPool(DefaultPoolSize, 4096, 1)
	buf := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		pos := i % p.Units()
		copy(buf, p.data[pos*4096:(pos+1)*4096])
		PutHeader(buf, Header{Gen: uint32(i), Offset: int64(i) * 4096, Seed: 1})
	}
}

// BenchmarkVerify is the cost of checking one 4 KiB unit read back (full CRC-32C).
func BenchmarkVerify(b *testing.B) {
	u := make([]byte, 4096)
	NewPool(1<<16, 4096, 1).Fill(u, 0, Header{Gen: 1, Seed: 1})
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeHeader(u); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPoolPRNG compares the generators for filling the pool once at start.
func BenchmarkPoolPRNG(b *testing.B) {
	buf := make([]byte, 1<<20)
	b.Run("chacha8", func(b *testing.B) {
		r := rand.NewChaCha8([32]byte{1})
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			r.Read(buf)
		}
	})
	b.Run("pcg", func(b *testing.B) {
		r := rand.NewPCG(1, 2)
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			for i := 0; i < len(buf); i += 8 {
				binary.LittleEndian.PutUint64(buf[i:], r.Uint64())
			}
		}
	})
	b.Run("crc32c", func(b *testing.B) { // for scale: the checksum pass over the same bytes
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			crc32.Checksum(buf, castagnoli)
		}
	})
}

// nullDev accepts everything at once: Run against it measures the generator alone.
type nullDev struct{}

func (nullDev) ReadAt(p []byte, off int64) (int, error)     { return len(p), nil }
func (nullDev) WriteAt(p []byte, off int64) (int, error)    { return len(p), nil }
func (nullDev) WriteAtFUA(p []byte, off int64) (int, error) { return len(p), nil }
func (nullDev) Flush() error                                { return nil }

// BenchmarkRunNull is the whole engine (workers, block claims, fill, latency histogram) per
// 4 KiB random write against a device that costs nothing.
func BenchmarkRunNull(b *testing.B) {
	for _, verify := range []bool{false, true} {
		name := "plain"
		if verify {
			name = "tracked"
		}
		b.Run(name, func(b *testing.B) {
			const size = 1 << 30
			cfg := Config{Mode: RandWrite, BlockSize: 4096, IODepth: 32, DeviceSize: size, Size: int64(b.N) * 4096 * 4,
				Seed: 1, Verify: verify}
			cfg.Size = min(max(cfg.Size, 1<<20), size)
			b.SetBytes(4096)
			b.ReportAllocs()
			b.ResetTimer()
			// One pass does Size/4096 writes; scale to b.N by running as many passes as needed.
			var done int64
			for done < int64(b.N) {
				res, err := Run(context.Background(), cfg, []Device{nullDev{}})
				if err != nil && !verify {
					b.Fatal(err)
				}
				done += res.WriteIOs
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return itoa(n>>20) + "M"
	}
	return itoa(n>>10) + "K"
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
