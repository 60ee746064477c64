package parity

import (
	"bytes"
	"errors"
	"fmt"
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
}

// New returns a Coder for stripes of data data chunks and one parity chunk.
func New(data int) (*Coder, error) {
	if data < MinData || data > MaxData {
		return nil, fmt.Errorf("%w: %d (want %d..%d)", ErrDataCount, data, MinData, MaxData)
	}
	return &Coder{data: data}, nil
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

// xorAll sets shards[dst] to the XOR of every other shard (at least two), in one pass
// (xorInto). The sources are gathered in an array on the stack: nothing allocates.
//
// Why not klauspost/reedsolomon's one-pass Encode (with WithFastOneParityMatrix, an all-ones
// parity row): it allocates on every call (v1.14.2 builds its GFNI matrix in a local array
// that escapes through an indirect call, and its AVX2 path boxes a pooled slice), and the hot
// path must not allocate; its kernels also multiply in GF(2^8) where XOR is all there is.
func (c *Coder) xorAll(shards [][]byte, dst int) {
	var buf [MaxData + 1][]byte
	srcs := buf[:0]
	for i, s := range shards {
		if i != dst {
			srcs = append(srcs, s)
		}
	}
	xorInto(shards[dst], srcs)
}

// Update folds a change of one data chunk into its parity (read-modify-write):
// p ^= old ^ new. p is written; old and new are read only. All three must have equal length.
func (c *Coder) Update(p, old, new []byte) error {
	if len(p) == 0 || len(old) != len(p) || len(new) != len(p) {
		return ErrShape
	}
	xorInto(p, [][]byte{p, old, new}) // p is the first source: it may be dst
	return nil
}

// Verify reports whether shards[Data()] equals the XOR of the data shards. It reads only,
// stops at the first differing block and does not allocate.
func (c *Coder) Verify(shards [][]byte) (bool, error) {
	if err := c.check(shards); err != nil {
		return false, err
	}
	var buf [verifyBlock]byte
	var sub [MaxData][]byte
	n := len(shards[0])
	for s := 0; s < n; s += verifyBlock {
		e := min(s+verifyBlock, n)
		b := buf[:e-s]
		for i, d := range shards[:c.data] {
			sub[i] = d[s:e]
		}
		xorInto(b, sub[:c.data])
		if !bytes.Equal(b, shards[c.data][s:e]) {
			return false, nil
		}
	}
	return true, nil
}

// verifyBlock is how much of a stripe Verify checks at a time, in a stack buffer.
const verifyBlock = 4 << 10
