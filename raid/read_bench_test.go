package raid_test

import (
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// BenchmarkRead reads over in-memory members of a 4-member array (64 KiB chunks), nothing
// cached: 4 KiB inside one chunk (one member read), 64 KiB across two chunks (two members),
// and a whole stripe, with the default member timeout and without one (MemberTimeout < 0).
// The figures are the array's own cost per request plus a memcpy per byte.
func BenchmarkRead(b *testing.B) {
	const chunk = 64 << 10
	for _, tm := range []struct {
		name    string
		timeout time.Duration
	}{{"timeout", 0}, {"notimeout", -1}} {
		for _, cm := range []struct {
			name string
			io   raid.IOOptions
		}{{"cache", raid.IOOptions{}}, {"cacheless", raid.IOOptions{StripeCache: -1}}} {
			io := cm.io
			io.MemberTimeout = tm.timeout
			a := benchArray(b, 4, chunk, io)
			ss := a.Layout().StripeSize()
			stripes := mustSize(a) / ss
			for _, c := range []struct {
				name      string
				size, off int64 // request size, offset within its stripe
			}{{"4k", 4 << 10, 8 << 10}, {"64k-2members", chunk, chunk / 2}, {"stripe", ss, 0}} {
				b.Run(tm.name+"-"+cm.name+"-"+c.name, func(b *testing.B) {
					p := make([]byte, c.size)
					b.SetBytes(c.size)
					b.ReportAllocs()
					i := int64(0)
					for b.Loop() {
						if _, err := a.ReadAt(p, (i%(stripes-1))*ss+c.off); err != nil {
							b.Fatal(err)
						}
						i++
					}
				})
			}
		}
	}
}
