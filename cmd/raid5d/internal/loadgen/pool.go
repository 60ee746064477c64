package loadgen

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
)

// Pool is a buffer of incompressible bytes filled once at start. Writes are sent straight from
// it: Stamp rewrites only the 32-byte header of each unit of a slice in place, so a 4 KiB write
// costs a 28-byte CRC update, not a 4 KiB copy. Each caller of Stamp must own the unit
// positions it stamps (no two callers, and no request in flight, on the same positions); the
// payload bytes after each header never change, so the precomputed payload CRCs stay right.
// Fill is the copying variant for a caller with its own buffer.
type Pool struct {
	data []byte
	unit int
	crcs []uint32 // crcs[i] is the CRC-32C of data[i*unit+HeaderSize : (i+1)*unit]
}

// DefaultPoolSize is the pool size Run uses (rounded up to a whole number of units).
const DefaultPoolSize = 32 << 20

// NewPool fills size bytes (rounded up to a multiple of unit) from a PCG stream seeded by
// seed (2.6 GB/s against ChaCha8's 1.4 here: BenchmarkPoolPRNG) and precomputes the payload checksum of every unit position. unit must exceed
// HeaderSize.
func NewPool(size, unit int, seed uint64) *Pool {
	size = (size + unit - 1) / unit * unit
	p := &Pool{data: make([]byte, size), unit: unit, crcs: make([]uint32, size/unit)}
	r := rand.NewPCG(seed, 0x5241494435) // unit is a multiple of 8
	for i := 0; i < size; i += 8 {
		binary.LittleEndian.PutUint64(p.data[i:], r.Uint64())
	}
	for i := range p.crcs {
		p.crcs[i] = crc32.Checksum(p.data[i*unit+HeaderSize:(i+1)*unit], castagnoli)
	}
	return p
}

// Units returns the number of unit positions in the pool.
func (p *Pool) Units() int { return len(p.crcs) }

// Stamp stamps the n bytes (a whole number of units) at unit position pos with h, its Offset
// advanced by one unit per unit, and returns them: a slice of the pool, valid until the caller
// stamps the same positions again. pos+n/unit must not pass Units().
func (p *Pool) Stamp(pos, n int, h Header) []byte {
	u := p.unit
	b := p.data[pos*u : pos*u+n]
	for k := 0; k < n; k += u {
		stamp(b[k:k+u], h, p.crcs[pos+k/u])
		h.Offset += int64(u)
	}
	return b
}

// Fill fills dst (a whole number of units) with the units at positions pos, pos+1, ...
// (wrapping) of the pool, and stamps unit k with h, its Offset advanced by k units. It returns
// the position after the last unit used. dst is written; the pool is only read.
func (p *Pool) Fill(dst []byte, pos int, h Header) int {
	u := p.unit
	pos %= len(p.crcs)
	for k := 0; k+u <= len(dst); k += u {
		unit := dst[k : k+u]
		copy(unit[HeaderSize:], p.data[pos*u+HeaderSize:(pos+1)*u])
		stamp(unit, h, p.crcs[pos])
		h.Offset += int64(u)
		if pos++; pos == len(p.crcs) {
			pos = 0
		}
	}
	return pos
}
