package raid_test

import (
	"fmt"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// benchArray returns an array of n in-memory members with chunk-sized chunks, 64 stripes.
func benchArray(b *testing.B, n int, chunk int64, io raid.IOOptions) *raid.Array {
	b.Helper()
	ms := newMems("b", n, raid.DataOffset+64*chunk)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: chunk, IOOptions: io})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}

var benchModes = []struct {
	name   string
	io     raid.IOOptions
	pinned bool
}{
	{"copy", raid.IOOptions{}, false},
	{"stable", raid.IOOptions{StablePages: true}, false},
	{"pinned", raid.IOOptions{StablePages: true}, true},
	{"cacheless", raid.IOOptions{StripeCache: -1}, false},
}

// BenchmarkFullStripe writes whole stripes, one per op, over in-memory members: the array's
// own cost (parity, locking, the copy when stable pages are off) plus a memcpy per member
// byte. copied/B is the bytes copied into the cache per byte written (0 with stable pages).
func BenchmarkFullStripe(b *testing.B) {
	for _, n := range []int{4, 8} {
		for _, m := range benchModes {
			b.Run(fmt.Sprintf("%s-n%d-c64k", m.name, n), func(b *testing.B) {
				a := benchArray(b, n, 64<<10, m.io)
				ss := a.Layout().StripeSize()
				stripes := mustSize(a) / ss
				p := make([]byte, ss)
				fill(newRand(4), p)
				release := func() {}
				b.SetBytes(ss)
				b.ReportAllocs()
				before := a.Counters()
				i := int64(0)
				for b.Loop() {
					off := (i % stripes) * ss
					var err error
					if m.pinned {
						_, err = a.WritePinned(p, off, release)
					} else {
						_, err = a.WriteAt(p, off)
					}
					if err != nil {
						b.Fatal(err)
					}
					i++
				}
				c := a.Counters()
				b.ReportMetric(float64(c.CopiedBytes-before.CopiedBytes)/float64(i*ss), "copied/B")
				b.ReportMetric(float64(c.MemberBytesRead-before.MemberBytesRead)/float64(i*ss), "read/B")
			})
		}
	}
}

// BenchmarkSeq4K writes 4 KiB at a time in sequence, wrapping around the array, and writes out
// the cache at the end (timed): with the cache against without. read/B is member bytes read per
// byte written.
func BenchmarkSeq4K(b *testing.B) {
	for _, m := range benchModes {
		b.Run(m.name+"-n4-c64k", func(b *testing.B) {
			a := benchArray(b, 4, 64<<10, m.io)
			size := mustSize(a)
			const unit = 4 << 10
			bufs := make([][]byte, 64)
			for i := range bufs {
				bufs[i] = make([]byte, unit)
				fill(newRand(uint64(i)), bufs[i])
			}
			release := func() {}
			b.SetBytes(unit)
			b.ReportAllocs()
			before := a.Counters()
			b.ResetTimer()
			for i := range b.N {
				off := int64(i) * unit % size
				p := bufs[i%len(bufs)]
				var err error
				if m.pinned {
					_, err = a.WritePinned(p, off, release)
				} else {
					_, err = a.WriteAt(p, off)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if err := a.Flush(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			c := a.Counters()
			w := float64(b.N) * unit
			b.ReportMetric(float64(c.MemberBytesRead-before.MemberBytesRead)/w, "read/B")
			b.ReportMetric(float64(c.FullStripeWrites-before.FullStripeWrites), "full-stripes")
		})
	}
}
