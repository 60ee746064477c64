//go:build invariants

package cache

import (
	"errors"
	"fmt"

	"github.com/raid5d/raid5d/stripe"
)

// Under the invariants build tag (go test -tags invariants), every successful write-out and
// full-stripe write of a stripe with no missing role re-reads the whole stripe through the
// Backend, under the stripe lock the writer holds, and panics with errParityMismatch if the
// parity does not match the data. It costs a stripe's worth of member reads per write and so
// changes the member read counters; it never changes what is written or returned.

// invariantsEnabled: see invariants_off.go.
const invariantsEnabled = true

// errParityMismatch is the panic value's sentinel: a stripe's parity on the members does not
// match its data right after the cache wrote it.
var errParityMismatch = errors.New("cache: invariants: parity does not match the data")

// checkWriteOut checks stripe s after a successful writeOut of h. A partial write-out
// recomputes only the parity of the unit columns it writes, so when the rest of the parity
// may be stale (MustReconstruct, or an earlier write-out that failed half way) only a
// write-out of every unit is checked.
func (c *Cache) checkWriteOut(h *head, s int64) {
	whole := h.nDirty == c.nd*c.upc
	trusted := !h.mustRCW && (c.mustRC == nil || !c.mustRC(s))
	if whole || trusted {
		c.checkStripes(s, 1, "write-out")
	}
}

// checkStripes checks the stripes [s0, s0+n) after what (a write of them) succeeded. A stripe
// with a missing role, or one whose re-read fails, is not checked: there is nothing to compare.
func (c *Cache) checkStripes(s0, n int64, what string) {
	for s := s0; s < s0+n; s++ {
		if c.backend.Missing(s) >= 0 {
			continue
		}
		shards := make([][]byte, c.nd+1)
		ops := make([]stripe.MemberOp, c.nd+1)
		for d := range shards {
			r := c.layout.ParityMember(s)
			if d < c.nd {
				r = c.layout.DataMember(s, d)
			}
			shards[d] = make([]byte, c.chunk)
			ops[d] = stripe.MemberOp{Role: r, Buf: shards[d], Off: s * c.chunk}
		}
		if err := c.backend.Do(ops); err != nil {
			continue
		}
		ok, err := c.coder.Verify(shards)
		if err != nil {
			panic(fmt.Errorf("cache: invariants: stripe %d: %w", s, err))
		}
		if ok {
			continue
		}
		want := make([]byte, c.chunk)
		c.coder.Encode(append(shards[:c.nd:c.nd], want))
		at := 0
		for at < len(want) && want[at] == shards[c.nd][at] {
			at++
		}
		panic(fmt.Errorf("%w: stripe %d, parity role %d, after a %s: first difference at byte %d of the chunk",
			errParityMismatch, s, c.layout.ParityMember(s), what, at))
	}
}
