package cache

import (
	"testing"

	"github.com/raid5d/raid5d/stripe"
)

// BenchmarkWriteOut measures the cache's own work per stripe write — planning, parity, building
// the member operations — against in-memory members, on one goroutine (no write-back
// goroutines): a 4 KiB unit read-modify-written, half a stripe reconstruct-written, a whole
// stripe copied and written out, a whole stripe written straight from a stable buffer, and a
// batch of 8 whole stripes.
func BenchmarkWriteOut(b *testing.B) {
	l, _ := stripe.NewLayout(8, 64<<10, stripe.LeftSymmetric)
	ss := l.StripeSize()
	for _, bc := range []struct {
		name   string
		n      int64 // bytes written
		stable bool
	}{
		{"rmw-4k", stripe.UnitSize, false},
		{"rcw-half", ss / 2, false},
		{"full-copy", ss, false},
		{"full-stable", ss, true},
		{"batch8-stable", 8 * ss, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, _, _ := newTestCache(b, l, 16, 4, -1, 1)
			p := make([]byte, bc.n)
			b.SetBytes(bc.n)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				off := int64(i%8) * ss
				if _, err := c.Write(p, off, bc.stable, nil); err != nil {
					b.Fatal(err)
				}
				if err := c.FlushRange(off, bc.n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
