package nbdmember

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/raid/member"
)

var _ member.Reporter = (*Member)(nil)

// stats are a member's request counters: do and Sync count every request (begin, end),
// from its call to its return, waiting for a reconnect included (the time the array sees),
// and Report reads them. All are atomics but the latency window's rotation, so that counting
// costs a request no lock and no allocation: four atomic additions, a compare for the
// longest, and two readings of the clock (BenchmarkStats).
type stats struct {
	inFlight atomic.Int64
	errors   atomic.Uint64
	win      window // the answered requests: their count and time, since Open too
}

// window is the latency of the requests answered in the current interval (count, sum, max:
// atomics, added to without a lock) and in the last one that ended (last). The interval
// ends, and a new one begins, at the first request answered or Report made once it is
// LatencyWindow old. A request answered just as the interval turns over may be counted in
// either one, or split between them: it is a gauge for people, not an account.
type window struct {
	start atomic.Int64 // the current interval's start, in time.Now().UnixNano()
	count atomic.Uint64
	sum   atomic.Int64
	max   atomic.Int64

	mu   sync.Mutex // guards last and closed, and makes one caller turn an interval over
	last member.Latency
	// closed counts the requests of the intervals that ended, and their time: with count
	// and sum, every request since Open.
	closedN   uint64
	closedSum int64
}

// begin counts a request sent and returns its start time, for end.
func (s *stats) begin() time.Time {
	s.inFlight.Add(1)
	return time.Now()
}

// end counts the request begun at t0 as answered with *errp (end is deferred before the
// request's error is known).
func (s *stats) end(t0 time.Time, errp *error) {
	now := time.Now()
	d := now.Sub(t0).Nanoseconds()
	s.inFlight.Add(-1)
	if *errp != nil {
		s.errors.Add(1)
	}
	w := &s.win
	if now.UnixNano()-w.start.Load() >= int64(member.LatencyWindow) {
		w.turn(now)
	}
	w.count.Add(1)
	w.sum.Add(d)
	for m := w.max.Load(); d > m && !w.max.CompareAndSwap(m, d); m = w.max.Load() {
	}
}

// turn ends the current interval at now, if it is LatencyWindow old, and begins the next.
func (w *window) turn(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := w.start.Load()
	switch {
	case start == 0: // the first request or report: the first interval begins
		w.start.Store(now.UnixNano())
		return
	case now.UnixNano()-start < int64(member.LatencyWindow):
		return // another caller turned it
	}
	n, sum, mx := w.count.Swap(0), w.sum.Swap(0), w.max.Swap(0)
	w.closedN, w.closedSum = w.closedN+n, w.closedSum+sum
	w.last = member.Latency{Window: time.Duration(now.UnixNano() - start), Requests: n, Max: time.Duration(mx)}
	if n > 0 {
		w.last.Mean = time.Duration(sum / int64(n))
	}
	w.start.Store(now.UnixNano())
}

// total is the number of requests answered since Open, and their time.
func (w *window) total() (uint64, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closedN + w.count.Load(), time.Duration(w.closedSum + w.sum.Load())
}

// latency is the last interval's latency, turning the current one over first if it is due;
// before the first interval has ended, the current one so far (it began at the member's
// first request or report).
func (w *window) latency(now time.Time) member.Latency {
	if now.UnixNano()-w.start.Load() >= int64(member.LatencyWindow) {
		w.turn(now)
	}
	w.mu.Lock()
	l := w.last
	w.mu.Unlock()
	if l.Window > 0 {
		return l
	}
	l = member.Latency{Window: time.Duration(now.UnixNano() - w.start.Load()), Requests: w.count.Load(), Max: time.Duration(w.max.Load())}
	if l.Requests > 0 {
		l.Mean = time.Duration(w.sum.Load() / int64(l.Requests))
	}
	return l
}

// Report (member.Reporter) says what the server offers for the export and how the member's
// requests fare: in flight now, answered and failed since Open with their total time, and
// the mean and longest over the last interval (member.LatencyWindow). The link is
// LinkConnected while a generation of connections serves, LinkReconnecting while one of its
// connections broke and requests wait for new ones, and LinkDown once the member has failed
// (lost writes, a changed export) or closed, or while a connection is broken and no request
// is waiting (the array no longer sends any to a member it failed).
func (m *Member) Report() member.Report {
	g := m.cur.Load()
	conns := g.list()
	minB, prefB, maxB := conns[0].c.BlockSize()
	r := member.Report{
		Kind: "nbd", State: member.LinkConnected, Server: m.uri.Export, ServerName: conns[0].c.ExportName(),
		Features: FlagNames(m.flags), MinBlock: int64(minB), PreferredBlock: int64(prefB), MaxBlock: int64(maxB),
		Conns: len(conns), Reconnects: uint64(m.reconnects.Load()), InFlight: m.stats.inFlight.Load(),
		Errors: m.stats.errors.Load(), Latency: m.stats.win.latency(time.Now()),
	}
	r.Requests, r.RequestTime = m.stats.win.total()
	r.WriteBatches, r.RequestsWritten = m.ctr.WriteBatches.Load(), m.ctr.RequestsWritten.Load()
	r.ReplyReads, r.Replies = m.ctr.ReplyReads.Load(), m.ctr.Replies.Load()
	broken := g.retired.Load()
	for _, c := range conns {
		broken = broken || c.c.Err() != nil // noticed by the reply reader, not yet by a request
	}
	if broken {
		m.mu.Lock()
		down := m.unusable() != nil
		m.mu.Unlock()
		r.Conns, r.State = 0, member.LinkReconnecting
		if down || r.InFlight == 0 {
			r.State = member.LinkDown
		}
	}
	return r
}

// flagNames are the names of the transmission flags, by bit, as the NBD protocol spells them
// (NBD_FLAG_SEND_FLUSH: flush), for status and metrics.
var flagNames = [16]string{
	0: "has_flags", 1: "read_only", 2: "flush", 3: "fua", 4: "rotational", 5: "trim",
	6: "write_zeroes", 7: "df", 8: "multi_conn", 9: "resize", 10: "cache", 11: "fast_zero",
	12: "block_status_payload",
}

// FlagNames decodes transmission flags into their names (flagNames), in bit order, leaving
// out has_flags, which every server sets; an unknown bit is named by its value (0x2000).
func FlagNames(f uint16) []string {
	names := []string{}
	for f &^= client.FlagHasFlags; f != 0; f &= f - 1 {
		b := bits.TrailingZeros16(f)
		if n := flagNames[b]; n != "" {
			names = append(names, n)
		} else {
			names = append(names, fmt.Sprintf("%#x", 1<<b))
		}
	}
	return names
}
