package loadgen

import (
	"math/bits"
	"time"
)

// Histogram counts latencies in log-linear buckets, as HdrHistogram does: values below 32 ns
// exactly, then 32 buckets per power of two (relative error under 3.2%). Record allocates
// nothing; a Histogram is owned by one goroutine and merged afterwards.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64
	max    uint64
}

const (
	histSubBits = 5
	histBuckets = (64-histSubBits)<<histSubBits + 1<<histSubBits
)

func histIndex(v uint64) int {
	if v < 1<<histSubBits {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits - 1
	return (shift+1)<<histSubBits + int(v>>shift) - 1<<histSubBits
}

// histLow is the smallest value in bucket i; histHigh the largest.
func histLow(i int) uint64 {
	if i < 1<<histSubBits {
		return uint64(i)
	}
	shift := i>>histSubBits - 1
	m := uint64(i&(1<<histSubBits-1)) + 1<<histSubBits
	return m << shift
}

func histHigh(i int) uint64 {
	if i+1 >= histBuckets {
		return ^uint64(0)
	}
	return histLow(i+1) - 1
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histIndex(v)]++
	h.n++
	h.sum += v
	h.max = max(h.max, v)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of latencies recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the latency at quantile q (0..1): the upper edge of the bucket holding it,
// capped at the maximum recorded, so it never understates.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return time.Duration(min(histHigh(i), h.max))
		}
	}
	return time.Duration(h.max)
}

// Latency is the summary of a Histogram.
type Latency struct {
	Count uint64        `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p99_9_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summary returns the count, mean, percentiles and maximum.
func (h *Histogram) Summary() Latency {
	l := Latency{Count: h.n, Max: time.Duration(h.max)}
	if h.n > 0 {
		l.Mean = time.Duration(h.sum / h.n)
		l.P50, l.P90, l.P99, l.P999 = h.Quantile(.5), h.Quantile(.9), h.Quantile(.99), h.Quantile(.999)
	}
	return l
}
