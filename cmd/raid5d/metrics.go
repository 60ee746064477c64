package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

// Prometheus metrics (serve --metrics). The array's values are read at scrape time by
// arrayCollector, from one (*raid.Array).Status call; request counts, bytes and latencies are
// counted by metricsDevice, which wraps the device the NBD server exports.

// The request commands, the values of the cmd label.
const (
	cmdRead        = "read"
	cmdWrite       = "write" // WriteAt, WriteAtFUA and WritePinned alike
	cmdFlush       = "flush"
	cmdTrim        = "trim"
	cmdWriteZeroes = "write_zeroes"
	cmdBlockStatus = "block_status"
)

var requestCmds = []string{cmdRead, cmdWrite, cmdFlush, cmdTrim, cmdWriteZeroes, cmdBlockStatus}

// requestDurationBuckets span a page-cache hit (tens of µs) to a member timeout (seconds).
var requestDurationBuckets = prometheus.ExponentialBuckets(50e-6, 4, 10)

// requestMetrics are the per-command request metrics.
type requestMetrics struct {
	requests *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	errors   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// by command, resolved once so the I/O path neither allocates nor looks up labels
	byCmd map[string]cmdMetrics
}

type cmdMetrics struct {
	requests, bytes, errors prometheus.Counter
	duration                prometheus.Observer
}

func newRequestMetrics() *requestMetrics {
	m := &requestMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raid5d_requests_total", Help: "NBD requests handled by the array, by command.",
		}, []string{"cmd"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raid5d_request_bytes_total",
			Help: "Bytes of NBD requests by command: transferred for read and write, the range length for trim and write_zeroes, the range described for block_status.",
		}, []string{"cmd"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raid5d_request_errors_total", Help: "NBD requests the array answered with an error, by command.",
		}, []string{"cmd"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raid5d_request_duration_seconds", Help: "Time the array took to serve an NBD request, by command.",
			Buckets: requestDurationBuckets,
		}, []string{"cmd"}),
		byCmd: map[string]cmdMetrics{},
	}
	for _, c := range requestCmds {
		m.byCmd[c] = cmdMetrics{
			requests: m.requests.WithLabelValues(c), bytes: m.bytes.WithLabelValues(c),
			errors: m.errors.WithLabelValues(c), duration: m.duration.WithLabelValues(c),
		}
	}
	return m
}

func (m *requestMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.bytes, m.errors, m.duration}
}

// done records one request of cmd that started at start and covered n bytes.
func (m *requestMetrics) done(cmd string, start time.Time, n int64, err error) {
	c := m.byCmd[cmd]
	c.duration.Observe(time.Since(start).Seconds())
	c.requests.Inc()
	m.count(cmd, n, err)
}

// count records n bytes of a request of cmd, and its error if any, but not the request: a
// piece of a WRITE placed in several (CommitPlaced).
func (m *requestMetrics) count(cmd string, n int64, err error) {
	c := m.byCmd[cmd]
	if n > 0 {
		c.bytes.Add(float64(n))
	}
	if err != nil {
		c.errors.Inc()
	}
}

// metricsDevice wraps an nbd.Device and records every request in m. It is safe for concurrent
// use as the device is. Use instrumentDevice, which keeps the device's optional interfaces.
type metricsDevice struct {
	d nbd.Device
	m *requestMetrics
}

// The optional interfaces the wrapper passes through when the wrapped device has them: the
// server finds them by type assertion, so a wrapper without them would silently turn FUA
// writes into write+flush, stable pages into copies, and holes into data. Each part adds one;
// instrumentDevice combines the parts the device has with the base wrapper, whose methods win
// over the parts' (they are shallower).
type (
	fuaPart         struct{ *metricsDevice }
	pinnedPart      struct{ *metricsDevice }
	blockStatusPart struct{ *metricsDevice }
)

var (
	_ nbd.MappedReader  = (*metricsDevice)(nil)
	_ nbd.PlacedWriter  = (*metricsDevice)(nil)
	_ nbd.CachedWriter  = (*metricsDevice)(nil)
	_ nbd.FUAWriter     = fuaPart{}
	_ nbd.PinnedWriter  = pinnedPart{}
	_ nbd.BlockStatuser = blockStatusPart{}
)

// instrumentDevice returns d wrapped to record its requests in m. The result implements
// nbd.FUAWriter, nbd.PinnedWriter and nbd.BlockStatuser exactly when d does.
func instrumentDevice(d nbd.Device, m *requestMetrics) nbd.Device {
	md := &metricsDevice{d: d, m: m}
	f, p, b := fuaPart{md}, pinnedPart{md}, blockStatusPart{md}
	_, fua := d.(nbd.FUAWriter)
	_, pinned := d.(nbd.PinnedWriter)
	_, bs := d.(nbd.BlockStatuser)
	switch {
	case fua && pinned && bs:
		return struct {
			*metricsDevice
			fuaPart
			pinnedPart
			blockStatusPart
		}{md, f, p, b}
	case fua && pinned:
		return struct {
			*metricsDevice
			fuaPart
			pinnedPart
		}{md, f, p}
	case fua && bs:
		return struct {
			*metricsDevice
			fuaPart
			blockStatusPart
		}{md, f, b}
	case pinned && bs:
		return struct {
			*metricsDevice
			pinnedPart
			blockStatusPart
		}{md, p, b}
	case fua:
		return struct {
			*metricsDevice
			fuaPart
		}{md, f}
	case pinned:
		return struct {
			*metricsDevice
			pinnedPart
		}{md, p}
	case bs:
		return struct {
			*metricsDevice
			blockStatusPart
		}{md, b}
	}
	return md
}

// ReadMapped passes a mapped read through when the wrapped device is an nbd.MappedReader, and
// answers "use ReadAt" otherwise: unlike the parts above, having it when the device does not
// changes nothing, so the base wrapper carries it.
func (d *metricsDevice) ReadMapped(p []byte, off int64, v [][]byte) ([][]byte, bool) {
	mr, ok := d.d.(nbd.MappedReader)
	if !ok {
		return v, false
	}
	start := time.Now()
	v, ok = mr.ReadMapped(p, off, v)
	if ok {
		d.m.done(cmdRead, start, int64(len(p)), nil)
	}
	return v, ok
}

func (d *metricsDevice) ReleaseMapped() { d.d.(nbd.MappedReader).ReleaseMapped() }

// PlaceWrite passes a placed write through when the wrapped device is an nbd.PlacedWriter, and
// answers "write as usual" otherwise; like ReadMapped, the base wrapper carries it.
func (d *metricsDevice) PlaceWrite(off int64, n int, v [][]byte) ([][]byte, any, bool) {
	pw, ok := d.d.(nbd.PlacedWriter)
	if !ok {
		return v, nil, false
	}
	return pw.PlaceWrite(off, n, v)
}

// WriteCached passes a cached write through when the wrapped device is an nbd.CachedWriter, and
// answers "write as usual" otherwise; like ReadMapped, the base wrapper carries it.
func (d *metricsDevice) WriteCached(p []byte, off int64, release func()) bool {
	cw, ok := d.d.(nbd.CachedWriter)
	if !ok {
		return false
	}
	start := time.Now()
	if !cw.WriteCached(p, off, release) {
		return false
	}
	d.m.done(cmdWrite, start, int64(len(p)), nil)
	return true
}

// ExpectWrite passes the hint through when the wrapped device is an nbd.WriteExpecter.
func (d *metricsDevice) ExpectWrite(off, n int64) {
	if we, ok := d.d.(nbd.WriteExpecter); ok {
		we.ExpectWrite(off, n)
	}
}

// PlaceUnit passes the wrapped device's unit through (0, no placed writes, if it has none).
func (d *metricsDevice) PlaceUnit() int64 {
	if pw, ok := d.d.(nbd.PlacedWriter); ok {
		return pw.PlaceUnit()
	}
	return 0
}

// PlacedReceived passes the progress of a placed piece through, if the wrapped device takes it.
func (d *metricsDevice) PlacedReceived(h any, received int) {
	if pp, ok := d.d.(nbd.PlacedProgresser); ok {
		pp.PlacedReceived(h, received)
	}
}

// CommitPlaced records the bytes received (all of them unless the connection broke) as written,
// and the last piece of a WRITE as its request; the time is that piece's commit (parity), as
// WriteAt's excludes the payload's arrival too. A WRITE whose rest was not placed is the
// request its WriteAt records.
func (d *metricsDevice) CommitPlaced(h any, received int, last bool) error {
	start := time.Now()
	err := d.d.(nbd.PlacedWriter).CommitPlaced(h, received, last)
	if last {
		d.m.done(cmdWrite, start, int64(received), err)
	} else {
		d.m.count(cmdWrite, int64(received), err)
	}
	return err
}

func (d *metricsDevice) ReadAt(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := d.d.ReadAt(p, off)
	d.m.done(cmdRead, start, int64(n), err)
	return n, err
}

func (d *metricsDevice) WriteAt(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := d.d.WriteAt(p, off)
	d.m.done(cmdWrite, start, int64(n), err)
	return n, err
}

func (d *metricsDevice) Size() (int64, error) { return d.d.Size() }

func (d *metricsDevice) Flush() error {
	start := time.Now()
	err := d.d.Flush()
	d.m.done(cmdFlush, start, 0, err)
	return err
}

func (d *metricsDevice) Trim(off, length int64) error {
	start := time.Now()
	err := d.d.Trim(off, length)
	d.m.done(cmdTrim, start, length, err)
	return err
}

func (d *metricsDevice) WriteZeroes(off, length int64, noHole bool) error {
	start := time.Now()
	err := d.d.WriteZeroes(off, length, noHole)
	d.m.done(cmdWriteZeroes, start, length, err)
	return err
}

func (d fuaPart) WriteAtFUA(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := d.d.(nbd.FUAWriter).WriteAtFUA(p, off)
	d.m.done(cmdWrite, start, int64(n), err)
	return n, err
}

// WritePinned passes p and release through untouched: the device keeps p until it calls
// release, as nbd.PinnedWriter says; the time recorded is until WritePinned returns, when the
// server replies.
func (d pinnedPart) WritePinned(p []byte, off int64, release func()) (int, error) {
	start := time.Now()
	n, err := d.d.(nbd.PinnedWriter).WritePinned(p, off, release)
	d.m.done(cmdWrite, start, int64(n), err)
	return n, err
}

// BlockStatus counts an NBD_CMD_BLOCK_STATUS with the length of the range it describes.
func (d blockStatusPart) BlockStatus(off, length int64, dst []nbd.Extent) ([]nbd.Extent, error) {
	start := time.Now()
	ext, err := d.d.(nbd.BlockStatuser).BlockStatus(off, length, dst)
	var n int64
	for _, e := range ext {
		n += e.Length
	}
	d.m.done(cmdBlockStatus, start, n, err)
	return ext, err
}

// The array states and member states, the values of the state labels; every one is exported
// (1 for the current state, 0 for the others) so a missing series never means "unknown".
var (
	arrayStates  = []raid.State{raid.StateClean, raid.StateActive, raid.StateDegraded, raid.StateFailed}
	memberStates = []string{raid.MemberActive, raid.MemberFaulty, raid.MemberSpare, raid.MemberRebuilding}
	linkStates   = []string{member.LinkConnected, member.LinkReconnecting, member.LinkDown}
)

// syncOps are the background operations whose progress is exported, and the raid.Progress
// kinds each one covers.
var syncOps = []struct {
	name  string
	kinds []string
	last  func(*raid.Status) *raid.Progress
}{
	{"rebuild", []string{"rebuild"}, func(s *raid.Status) *raid.Progress { return s.LastRebuild }},
	{"resync", []string{"resync"}, func(s *raid.Status) *raid.Progress { return s.LastResync }},
	{"scrub", []string{"check", "repair"}, func(s *raid.Status) *raid.Progress { return s.LastScrub }},
}

// arrayCollector exports an array's state and counters, read when Prometheus scrapes (no
// goroutine polls). bufferStats, if not nil, adds the NBD server's request buffers.
type arrayCollector struct {
	status      func() raid.Status
	bufferStats func() nbd.BufferStats
	descs       map[string]*prometheus.Desc
}

// gauge and counter name the kind of each arrayCollector metric.
const (
	gauge   = prometheus.GaugeValue
	counter = prometheus.CounterValue
)

type metricDef struct {
	name, help string
	labels     []string
}

var arrayMetricDefs = []metricDef{
	{"raid5d_array_state", "1 for the array's current state, 0 for the others.", []string{"state"}},
	{"raid5d_array_size_bytes", "The array's size.", nil},
	{"raid5d_array_dirty", "1 while the superblocks say dirty (writes since assembly, or an unclean shutdown).", nil},
	{"raid5d_array_write_hole", "1 if assembled degraded after an unclean shutdown: rebuilt chunks of stripes written at the crash may be wrong.", nil},
	{"raid5d_array_missing_roles", "Roles with no working active member.", nil},
	{"raid5d_array_members", "Members by state.", []string{"state"}},
	{"raid5d_member_state", "1 for each member's current state, 0 for the others.", []string{"member", "state"}},
	{"raid5d_member_read_errors_total", "Failed member reads (served by reconstruction).", []string{"member"}},
	{"raid5d_member_write_errors_total", "Failed member writes.", []string{"member"}},
	{"raid5d_member_direct", "1 for a member opened with O_DIRECT (--direct), 0 for one through the page cache or remote.", []string{"member"}},
	{"raid5d_remote_member_info", "1 for each remote member, with its kind, its export's name as the URI asks for it, the server's transmission flags and the name the server reports for the export (NBD_INFO_NAME, empty if none).", []string{"member", "kind", "export", "flags", "server_name"}},
	{"raid5d_remote_member_link", "1 for each remote member's current link state, 0 for the others.", []string{"member", "state"}},
	{"raid5d_remote_member_block_size_bytes", "A remote member's server's block sizes (size: min, preferred, max).", []string{"member", "size"}},
	{"raid5d_remote_member_connections", "Connections open to a remote member's server.", []string{"member"}},
	{"raid5d_remote_member_reconnects_total", "Connections to a remote member's server re-established.", []string{"member"}},
	{"raid5d_remote_member_requests_in_flight", "A remote member's requests sent and not yet answered.", []string{"member"}},
	{"raid5d_remote_member_requests_total", "A remote member's requests answered since it was opened.", []string{"member"}},
	{"raid5d_remote_member_request_errors_total", "A remote member's requests that failed.", []string{"member"}},
	{"raid5d_remote_member_request_seconds_total", "Total time of a remote member's answered requests: its rate over the requests' rate is the mean latency.", []string{"member"}},
	{"raid5d_remote_member_write_batches_total", "System calls (writev) that sent a remote member's requests: requests_written_total over it is the requests per batch.", []string{"member"}},
	{"raid5d_remote_member_requests_written_total", "A remote member's requests sent, in write batches.", []string{"member"}},
	{"raid5d_remote_member_reply_reads_total", "Reads from a remote member's sockets by the reply readers, those finding nothing included (none counted over TLS): replies_total over it is the replies per read.", []string{"member"}},
	{"raid5d_remote_member_replies_total", "Replies read from a remote member's server.", []string{"member"}},
	{"raid5d_remote_member_latency_mean_seconds", "Mean time of a remote member's requests over the last interval (about 10 s).", []string{"member"}},
	{"raid5d_remote_member_latency_max_seconds", "Longest time of a remote member's requests over the last interval (about 10 s).", []string{"member"}},
	{"raid5d_auto_re_add_members", "Away remote members serve --auto-re-add watches, by state (probing, refused); absent without --auto-re-add.", []string{"state"}},
	{"raid5d_sync_running", "1 while the operation runs (or waits to).", []string{"op"}},
	{"raid5d_sync_done_bytes", "Member data-area bytes done by the running operation, else by its last run.", []string{"op"}},
	{"raid5d_sync_total_bytes", "Member data-area bytes the running operation, else its last run, covers.", []string{"op"}},
	{"raid5d_sync_mismatches", "Stripes whose parity did not match in the running operation, else in its last run.", []string{"op"}},
	{"raid5d_full_stripe_writes_total", "Stripes written whole, parity from the new data alone.", nil},
	{"raid5d_rmw_writes_total", "Partial-stripe writes by read-modify-write.", nil},
	{"raid5d_rcw_writes_total", "Partial-stripe writes by reconstruct-write.", nil},
	{"raid5d_member_read_bytes_total", "Data-area bytes read from members.", nil},
	{"raid5d_member_mapped_read_bytes_total", "Of the member bytes read, those sent to clients straight from the members' mappings (--mapped-reads).", nil},
	{"raid5d_member_mapped_written_bytes_total", "Of the member bytes written, those written through the members' mappings (placed writes' data and parity, --mapped-writes).", nil},
	{"raid5d_placed_write_bytes_total", "Bytes of client writes whose payload was read from the socket straight into the members' mappings (--mapped-writes).", nil},
	{"raid5d_member_written_bytes_total", "Data-area bytes written to members.", nil},
	{"raid5d_cache_copied_bytes_total", "Bytes of writes copied into the stripe cache.", nil},
	{"raid5d_cache_hits_total", "Read pieces served from the stripe cache alone.", nil},
	{"raid5d_cache_misses_total", "Read pieces that needed member reads.", nil},
	{"raid5d_cache_evictions_total", "Clean cached stripes dropped to make room.", nil},
	{"raid5d_cache_write_throughs_total", "Partial writes written synchronously because the cache was full of dirty stripes.", nil},
	{"raid5d_cache_capacity_stripes", "The stripe cache's capacity, 0 without a cache.", nil},
	{"raid5d_bitmap_flushes_total", "Write-intent bitmap writes (absent without a bitmap).", nil},
	{"raid5d_bitmap_waits_total", "Stripe writes that waited for a bitmap write (absent without a bitmap).", nil},
	{"raid5d_bitmap_regions", "Write-intent bitmap bits (absent without a bitmap).", nil},
	{"raid5d_bitmap_regions_dirty", "Write-intent bitmap bits set now (absent without a bitmap).", nil},
	{"raid5d_nbd_buffers_mapped_bytes", "Bytes of NBD request buffers mapped now.", nil},
	{"raid5d_nbd_buffers_pinned", "NBD request buffers the array holds now (stable pages).", nil},
	{"raid5d_nbd_pinned_writes_total", "Writes handed to the array by reference (stable pages).", nil},
}

func newArrayCollector(status func() raid.Status, bufferStats func() nbd.BufferStats) *arrayCollector {
	c := &arrayCollector{status: status, bufferStats: bufferStats, descs: map[string]*prometheus.Desc{}}
	for _, d := range arrayMetricDefs {
		c.descs[d.name] = prometheus.NewDesc(d.name, d.help, d.labels, nil)
	}
	return c
}

// Describe sends every metric's description; the bitmap and buffer ones may then be absent
// from a scrape.
func (c *arrayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect reads the array's status once and sends its metrics.
func (c *arrayCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	emit := func(name string, kind prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], kind, v, labels...)
	}
	for _, s := range arrayStates {
		emit("raid5d_array_state", gauge, boolValue(st.State == s), s.String())
	}
	emit("raid5d_array_size_bytes", gauge, float64(st.Size))
	emit("raid5d_array_dirty", gauge, boolValue(st.Dirty))
	emit("raid5d_array_write_hole", gauge, boolValue(st.WriteHole))
	emit("raid5d_array_missing_roles", gauge, float64(len(st.Missing)))
	byState := map[string]int{}
	seen := map[string]bool{}
	for _, m := range st.Members {
		byState[m.State]++
		if seen[m.Path] {
			continue // one series per path: a scrape with duplicate label sets would fail whole
		}
		seen[m.Path] = true
		for _, s := range memberStates {
			emit("raid5d_member_state", gauge, boolValue(m.State == s), m.Path, s)
		}
		emit("raid5d_member_read_errors_total", counter, float64(m.ReadErrors), m.Path)
		emit("raid5d_member_write_errors_total", counter, float64(m.WriteErrors), m.Path)
		emit("raid5d_member_direct", gauge, boolValue(m.Direct), m.Path)
		if r := m.Remote; r != nil {
			emit("raid5d_remote_member_info", gauge, 1, m.Path, r.Kind, r.Server, strings.Join(r.Features, ","), r.ServerName)
			for _, s := range linkStates {
				emit("raid5d_remote_member_link", gauge, boolValue(r.State == s), m.Path, s)
			}
			emit("raid5d_remote_member_block_size_bytes", gauge, float64(r.MinBlock), m.Path, "min")
			emit("raid5d_remote_member_block_size_bytes", gauge, float64(r.PreferredBlock), m.Path, "preferred")
			emit("raid5d_remote_member_block_size_bytes", gauge, float64(r.MaxBlock), m.Path, "max")
			emit("raid5d_remote_member_connections", gauge, float64(r.Conns), m.Path)
			emit("raid5d_remote_member_reconnects_total", counter, float64(r.Reconnects), m.Path)
			emit("raid5d_remote_member_requests_in_flight", gauge, float64(r.InFlight), m.Path)
			emit("raid5d_remote_member_requests_total", counter, float64(r.Requests), m.Path)
			emit("raid5d_remote_member_request_errors_total", counter, float64(r.Errors), m.Path)
			emit("raid5d_remote_member_request_seconds_total", counter, r.RequestTime.Seconds(), m.Path)
			emit("raid5d_remote_member_write_batches_total", counter, float64(r.WriteBatches), m.Path)
			emit("raid5d_remote_member_requests_written_total", counter, float64(r.RequestsWritten), m.Path)
			emit("raid5d_remote_member_reply_reads_total", counter, float64(r.ReplyReads), m.Path)
			emit("raid5d_remote_member_replies_total", counter, float64(r.Replies), m.Path)
			emit("raid5d_remote_member_latency_mean_seconds", gauge, r.Latency.Mean.Seconds(), m.Path)
			emit("raid5d_remote_member_latency_max_seconds", gauge, r.Latency.Max.Seconds(), m.Path)
		}
	}
	if st.AutoReAdd != nil {
		refused := 0
		for _, p := range st.AutoReAdd {
			if p.Refused {
				refused++
			}
		}
		emit("raid5d_auto_re_add_members", gauge, float64(len(st.AutoReAdd)-refused), "probing")
		emit("raid5d_auto_re_add_members", gauge, float64(refused), "refused")
	}
	for _, s := range memberStates {
		emit("raid5d_array_members", gauge, float64(byState[s]), s)
	}

	for _, op := range syncOps {
		p, running := op.last(&st), false
		if st.Sync != nil {
			for _, k := range op.kinds {
				if st.Sync.Kind == k {
					p, running = st.Sync, true
				}
			}
		}
		var done, total, mismatches float64
		if p != nil {
			done, total, mismatches = float64(p.Done), float64(p.Total), float64(p.Mismatches)
		}
		emit("raid5d_sync_running", gauge, boolValue(running), op.name)
		emit("raid5d_sync_done_bytes", gauge, done, op.name)
		emit("raid5d_sync_total_bytes", gauge, total, op.name)
		emit("raid5d_sync_mismatches", gauge, mismatches, op.name)
	}

	k := st.Counters
	emit("raid5d_full_stripe_writes_total", counter, float64(k.FullStripeWrites))
	emit("raid5d_rmw_writes_total", counter, float64(k.RMWWrites))
	emit("raid5d_rcw_writes_total", counter, float64(k.RCWWrites))
	emit("raid5d_member_read_bytes_total", counter, float64(k.MemberBytesRead))
	emit("raid5d_member_mapped_read_bytes_total", counter, float64(k.MappedBytesRead))
	emit("raid5d_member_written_bytes_total", counter, float64(k.MemberBytesWritten))
	emit("raid5d_member_mapped_written_bytes_total", counter, float64(k.MappedBytesWritten))
	emit("raid5d_placed_write_bytes_total", counter, float64(k.PlacedBytes))
	emit("raid5d_cache_copied_bytes_total", counter, float64(k.CopiedBytes))
	emit("raid5d_cache_hits_total", counter, float64(k.CacheHits))
	emit("raid5d_cache_misses_total", counter, float64(k.CacheMisses))
	emit("raid5d_cache_evictions_total", counter, float64(k.CacheEvictions))
	emit("raid5d_cache_write_throughs_total", counter, float64(k.WriteThroughs))
	emit("raid5d_cache_capacity_stripes", gauge, float64(k.CacheStripes))

	if b := st.Bitmap; b != nil {
		emit("raid5d_bitmap_flushes_total", counter, float64(b.Flushes))
		emit("raid5d_bitmap_waits_total", counter, float64(b.Waits))
		emit("raid5d_bitmap_regions", gauge, float64(b.Regions))
		emit("raid5d_bitmap_regions_dirty", gauge, float64(b.Set))
	}
	if c.bufferStats != nil {
		b := c.bufferStats()
		emit("raid5d_nbd_buffers_mapped_bytes", gauge, float64(b.Mapped))
		emit("raid5d_nbd_buffers_pinned", gauge, float64(b.Pinned))
		emit("raid5d_nbd_pinned_writes_total", counter, float64(b.PinnedWrites))
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// newMetricsRegistry returns a registry with the array's metrics, the request metrics and Go's
// runtime and process metrics.
func newMetricsRegistry(ac *arrayCollector, rm *requestMetrics) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs := append([]prometheus.Collector{ac,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})},
		rm.collectors()...)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// listenMetrics opens the --metrics listener, which must be on a loopback address, like
// --pprof: member paths and load are nobody else's business, and the daemon has no TLS for HTTP.
func listenMetrics(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: --metrics %q: %v", errUsage, addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%w: --metrics %q: only a loopback address is allowed", errUsage, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	return ln, nil
}

// serveMetrics serves reg on /metrics from ln in a goroutine, until the returned stop is called;
// stop waits for the scrapes in flight (at most a few seconds) and for the goroutine.
func serveMetrics(ln net.Listener, reg *prometheus.Registry, log *slog.Logger) (stop func()) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), Timeout: 10 * time.Second,
	}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("metrics listening", "address", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		<-done
	}
}
