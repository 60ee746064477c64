package parity

import (
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
func (c *Coder) Encode(shards [][]byte) error {
	if err := c.check(shards); err != nil {
		return err
	}
	return c.enc.Encode(shards)
}

// Reconstruct rebuilds shards[missing] (written) from every other shard (read only).
// missing may be a data index or Data() for the parity chunk. The old contents of
// shards[missing] are ignored, but it must have the same length as the others.
func (c *Coder) Reconstruct(shards [][]byte, missing int) error {
	if err := c.check(shards); err != nil {
		return err
	}
	if missing < 0 || missing > c.data {
		return fmt.Errorf("%w: %d", ErrIndex, missing)
	}
	if missing == c.data {
		return c.enc.Encode(shards)
	}
	// With one all-ones parity row, any chunk is the XOR of all the others.
	dst := shards[missing]
	first := true
	for i, s := range shards {
		if i == missing {
			continue
		}
		if first {
			copy(dst, s)
			first = false
			continue
		}
		subtle.XORBytes(dst, dst, s)
	}
	return nil
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

// Verify reports whether shards[Data()] equals the XOR of the data shards. It reads only.
func (c *Coder) Verify(shards [][]byte) (bool, error) {
	if err := c.check(shards); err != nil {
		return false, err
	}
	return c.enc.Verify(shards)
}
