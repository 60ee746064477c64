package parity

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/klauspost/reedsolomon"
)

// Bounds on the number of data chunks per stripe (a RAID-5 of 3 to 32 members).
const (
	MinData = 2
	MaxData = 31
)

var (
	// ErrDataCount is returned by New for a data-chunk count outside MinData..MaxData.
	ErrDataCount = errors.New("parity: data chunk count out of range")
	// ErrShape is returned when the shard slice has the wrong count or unequal lengths.
	ErrShape = errors.New("parity: shards must be data+1 slices of equal non-zero length")
	// ErrIndex is returned for a shard index outside the stripe.
	ErrIndex = errors.New("parity: shard index out of range")
)

// Coder computes and checks RAID-5 parity (P, the XOR of the data chunks) for stripes with a
// fixed number of data chunks. The on-disk format is plain XOR, as Linux md writes it.
//
// A Coder holds no per-call state: its methods may be called concurrently. It does no I/O,
// starts no goroutines and keeps none of the slices it is given.
type Coder struct {
	data int
	enc  reedsolomon.Encoder
}

// New returns a Coder for stripes of data data chunks and one parity chunk.
func New(data int) (*Coder, error) {
	if data < MinData || data > MaxData {
		return nil, fmt.Errorf("%w: %d (want %d..%d)", ErrDataCount, data, MinData, MaxData)
	}
	// WithFastOneParityMatrix makes the single parity row all ones: P is the plain XOR of the
	// data, which is md's format. Without it the parity row has other coefficients for most
	// data counts. WithMaxGoroutines(1): parallelism belongs across stripes, not inside one.
	enc, err := reedsolomon.New(data, 1,
		reedsolomon.WithFastOneParityMatrix(),
		reedsolomon.WithMaxGoroutines(1))
	if err != nil {
		return nil, fmt.Errorf("parity: %w", err)
	}
	return &Coder{data: data, enc: enc}, nil
}

// Data returns the number of data chunks per stripe.
func (c *Coder) Data() int { return c.data }

func (c *Coder) check(shards [][]byte) error {
	if len(shards) != c.data+1 {
		return ErrShape
	}
	n := len(shards[0])
	if n == 0 {
		return ErrShape
	}
	for _, s := range shards[1:] {
		if len(s) != n {
			return ErrShape
		}
	}
	return nil
}

// Encode computes parity: shards[0:Data()] are the data chunks (read only) and
// shards[Data()] is the parity chunk (written). All shards must have the same length.
// It does not allocate.
func (c *Coder) Encode(shards [][]byte) error {
	if err := c.check(shards); err != nil {
		return err
	}
	c.xorAll(shards, c.data)
	return nil
}

// Reconstruct rebuilds shards[missing] (written) from every other shard (read only).
// missing may be a data index or Data() for the parity chunk. The old contents of
// shards[missing] are ignored, but it must have the same length as the others.
// It does not allocate.
func (c *Coder) Reconstruct(shards [][]byte, missing int) error {
	if err := c.check(shards); err != nil {
		return err
	}
	if missing < 0 || missing > c.data {
		return fmt.Errorf("%w: %d", ErrIndex, missing)
	}
	// With one all-ones parity row, any chunk is the XOR of all the others.
	c.xorAll(shards, missing)
	return nil
}

// xorAll sets shards[dst] to the XOR of every other shard (at least two). The first two go
// through one three-operand pass of subtle.XORBytes; the rest are folded in by the
// library's EncodeIdx, whose all-ones parity row makes it dst ^= src on its widest vector
// code. shards[dst:dst+1] hands EncodeIdx the destination without allocating.
//
// Why not enc.Encode: its one-pass kernel allocates on every call (reedsolomon v1.14.2
// builds its GFNI matrix in a local array that escapes through an indirect call, and its
// AVX2 path boxes a pooled slice), and the hot path must not allocate.
func (c *Coder) xorAll(shards [][]byte, dst int) {
	out := shards[dst : dst+1]
	first, second := 0, 1
	if dst == 0 {
		first, second = 1, 2
	} else if dst == 1 {
		second = 2
	}
	subtle.XORBytes(out[0], shards[first], shards[second])
	for i := second + 1; i < len(shards); i++ {
		if i == dst {
			continue
		}
		// Any data index names the same all-ones coefficient; 0 is always valid.
		_ = c.enc.EncodeIdx(shards[i], 0, out) // lengths checked by c.check; cannot fail
	}
}

// Update folds a change of one data chunk into its parity (read-modify-write):
// p ^= old ^ new. p is written; old and new are read only. All three must have equal length.
func (c *Coder) Update(p, old, new []byte) error {
	if len(p) == 0 || len(old) != len(p) || len(new) != len(p) {
		return ErrShape
	}
	subtle.XORBytes(p, p, old)
	subtle.XORBytes(p, p, new)
	return nil
}

// Verify reports whether shards[Data()] equals the XOR of the data shards. It reads only,
// stops at the first differing block and does not allocate.
func (c *Coder) Verify(shards [][]byte) (bool, error) {
	if err := c.check(shards); err != nil {
		return false, err
	}
	var buf [verifyBlock]byte
	n := len(shards[0])
	for s := 0; s < n; s += verifyBlock {
		e := min(s+verifyBlock, n)
		b := buf[:e-s]
		subtle.XORBytes(b, shards[0][s:e], shards[1][s:e])
		for _, d := range shards[2:c.data] {
			subtle.XORBytes(b, b, d[s:e])
		}
		if !bytes.Equal(b, shards[c.data][s:e]) {
			return false, nil
		}
	}
	return true, nil
}

// verifyBlock is how much of a stripe Verify checks at a time, in a stack buffer.
const verifyBlock = 4 << 10
