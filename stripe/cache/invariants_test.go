//go:build invariants

package cache

import (
	"bytes"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/parity"
	"github.com/raid5d/raid5d/stripe"
)

// badParity is a Backend that, once armed, writes every parity chunk or unit with its first
// byte flipped: a write-out whose parity disagrees with its data.
type badParity struct {
	*memMembers
	l     stripe.Layout
	armed atomic.Bool
}

func (b *badParity) Do(ops []stripe.MemberOp) error {
	if !b.armed.Load() {
		return b.memMembers.Do(ops)
	}
	C := b.l.ChunkSize()
	flip := func(p []byte) []byte { q := bytes.Clone(p); q[0] ^= 0xff; return q }
	ops = slices.Clone(ops)
	for i := range ops {
		op := &ops[i]
		if !op.Write {
			continue
		}
		if op.Vec == nil {
			if op.Role == b.l.ParityMember(op.Off/C) {
				op.Buf = flip(op.Buf)
			}
			continue
		}
		op.Vec = slices.Clone(op.Vec)
		off := op.Off
		for j, v := range op.Vec {
			if op.Role == b.l.ParityMember(off/C) {
				op.Vec[j] = flip(v)
			}
			off += int64(len(v))
		}
	}
	return b.memMembers.Do(ops)
}

// TestInvariantsCatchBadParity: under the invariants tag, each way the cache writes a stripe
// (a partial write-out, a whole stripe from the caller's buffer or copied, a batch of whole
// stripes) passes its parity check with honest members and panics with errParityMismatch when
// the members' parity is corrupted on the way.
func TestInvariantsCatchBadParity(t *testing.T) {
	l, err := stripe.NewLayout(4, 8<<10, stripe.LeftSymmetric)
	if err != nil {
		t.Fatal(err)
	}
	ss := l.StripeSize()
	for _, tc := range []struct {
		name  string
		write func(c *Cache) error
	}{
		{"write-out", func(c *Cache) error {
			if _, err := c.Write(make([]byte, stripe.UnitSize), ss+stripe.UnitSize, false, nil); err != nil {
				return err
			}
			return c.FlushRange(ss, 1) // in this goroutine, not Flush's
		}},
		{"full-stripe-stable", func(c *Cache) error { _, err := c.Write(make([]byte, ss), ss, true, nil); return err }},
		{"full-stripe-copied", func(c *Cache) error { _, err := c.Write(make([]byte, ss), ss, false, nil); return err }},
		{"batch", func(c *Cache) error { _, err := c.Write(make([]byte, 3*ss), 0, true, nil); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, armed := range []bool{false, true} {
				_, mm, _ := newTestCache(t, l, 4, 2, -1, 3)
				b := &badParity{memMembers: mm, l: l}
				b.armed.Store(armed)
				coder, err := parity.New(l.DataMembers())
				if err != nil {
					t.Fatal(err)
				}
				var locks stripe.Locks
				c := New(l, coder, b, &locks, Options{Stripes: 2, WriteBackDelay: time.Hour})
				var got any
				func() {
					defer func() { got = recover() }()
					if err := tc.write(c); err != nil {
						t.Fatal(err)
					}
				}()
				perr, _ := got.(error)
				switch {
				case !armed && got != nil:
					t.Fatalf("honest members: panic %v", got)
				case armed && !errors.Is(perr, errParityMismatch):
					t.Fatalf("corrupted parity: recovered %v, want a panic with errParityMismatch", got)
				}
			}
		})
	}
}
