package nbdmember

import (
	"testing"
)

// BenchmarkStats is what counting costs one request (begin and end, the latency window
// included): to set against a request's round trip (BenchmarkReadAt4K).
func BenchmarkStats(b *testing.B) {
	var s stats
	var err error
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.end(s.begin(), &err)
		}
	})
}
