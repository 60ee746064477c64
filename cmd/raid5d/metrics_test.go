package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

// documentedMetrics are the names the README lists; every one must be in a scrape of an array
// with a bitmap.
var documentedMetrics = []string{
	"raid5d_array_state", "raid5d_array_size_bytes", "raid5d_array_dirty", "raid5d_array_write_hole",
	"raid5d_array_missing_roles", "raid5d_array_members",
	"raid5d_member_state", "raid5d_member_read_errors_total", "raid5d_member_write_errors_total", "raid5d_member_direct",
	"raid5d_sync_running", "raid5d_sync_done_bytes", "raid5d_sync_total_bytes", "raid5d_sync_mismatches",
	"raid5d_full_stripe_writes_total", "raid5d_rmw_writes_total", "raid5d_rcw_writes_total",
	"raid5d_member_read_bytes_total", "raid5d_member_mapped_read_bytes_total", "raid5d_member_written_bytes_total",
	"raid5d_member_mapped_written_bytes_total", "raid5d_placed_write_bytes_total",
	"raid5d_cache_copied_bytes_total", "raid5d_cache_hits_total", "raid5d_cache_misses_total",
	"raid5d_cache_evictions_total", "raid5d_cache_write_throughs_total", "raid5d_cache_capacity_stripes",
	"raid5d_bitmap_flushes_total", "raid5d_bitmap_waits_total", "raid5d_bitmap_regions", "raid5d_bitmap_regions_dirty",
	"raid5d_nbd_buffers_mapped_bytes", "raid5d_nbd_buffers_pinned", "raid5d_nbd_pinned_writes_total",
	"raid5d_requests_total", "raid5d_request_bytes_total", "raid5d_request_errors_total",
	"raid5d_request_duration_seconds",
	"raid5d_remote_member_info", "raid5d_remote_member_link", "raid5d_remote_member_block_size_bytes",
	"raid5d_remote_member_connections", "raid5d_remote_member_reconnects_total", "raid5d_remote_member_requests_in_flight",
	"raid5d_remote_member_requests_total", "raid5d_remote_member_request_errors_total", "raid5d_remote_member_request_seconds_total",
	"raid5d_remote_member_write_batches_total", "raid5d_remote_member_requests_written_total",
	"raid5d_remote_member_reply_reads_total", "raid5d_remote_member_replies_total",
	"raid5d_remote_member_latency_mean_seconds", "raid5d_remote_member_latency_max_seconds",
	"raid5d_auto_re_add_members",
}

// fakeDevice records nothing; WriteAt fails at offset failAt.
type fakeDevice struct{ failAt int64 }

var errFake = errors.New("fake device error")

func (d *fakeDevice) ReadAt(p []byte, off int64) (int, error) { return len(p), nil }
func (d *fakeDevice) WriteAt(p []byte, off int64) (int, error) {
	if off == d.failAt {
		return 0, errFake
	}
	return len(p), nil
}
func (d *fakeDevice) Size() (int64, error)                        { return 1 << 20, nil }
func (d *fakeDevice) Flush() error                                { return nil }
func (d *fakeDevice) Trim(off, length int64) error                { return nil }
func (d *fakeDevice) WriteZeroes(off, length int64, _ bool) error { return nil }

type fakeFUA struct{ *fakeDevice }

func (d fakeFUA) WriteAtFUA(p []byte, off int64) (int, error) { return len(p), nil }

// fakePinned checks it is handed the caller's buffer and releases it.
type fakePinned struct {
	*fakeDevice
	got *[]byte
}

func (d fakePinned) WritePinned(p []byte, off int64, release func()) (int, error) {
	*d.got = p
	release()
	return len(p), nil
}

type fakeFUAPinned struct {
	fakeFUA
	fakePinned
}

func (d fakeFUAPinned) ReadAt(p []byte, off int64) (int, error) { return d.fakeFUA.ReadAt(p, off) }
func (d fakeFUAPinned) WriteAt(p []byte, off int64) (int, error) {
	return d.fakeFUA.WriteAt(p, off)
}
func (d fakeFUAPinned) Size() (int64, error)         { return d.fakeFUA.Size() }
func (d fakeFUAPinned) Flush() error                 { return d.fakeFUA.Flush() }
func (d fakeFUAPinned) Trim(off, length int64) error { return d.fakeFUA.Trim(off, length) }
func (d fakeFUAPinned) WriteZeroes(off, length int64, noHole bool) error {
	return d.fakeFUA.WriteZeroes(off, length, noHole)
}

// TestInstrumentDeviceKeepsInterfaces: the wrapper is a FUAWriter or PinnedWriter exactly when
// the device is, forwards the pinned buffer itself, and counts those writes as writes; the
// array itself gets both.
func TestInstrumentDeviceKeepsInterfaces(t *testing.T) {
	var got []byte
	base := &fakeDevice{failAt: -1}
	for _, tc := range []struct {
		name        string
		dev         nbd.Device
		fua, pinned bool
	}{
		{"plain", base, false, false},
		{"fua", fakeFUA{base}, true, false},
		{"pinned", fakePinned{base, &got}, false, true},
		{"both", fakeFUAPinned{fakeFUA{base}, fakePinned{base, &got}}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newRequestMetrics()
			d := instrumentDevice(tc.dev, m)
			fw, fua := d.(nbd.FUAWriter)
			pw, pinned := d.(nbd.PinnedWriter)
			if fua != tc.fua || pinned != tc.pinned {
				t.Fatalf("wrapped: FUAWriter %v PinnedWriter %v, want %v %v", fua, pinned, tc.fua, tc.pinned)
			}
			want := 0.0
			if fua {
				if n, err := fw.WriteAtFUA(make([]byte, 512), 0); n != 512 || err != nil {
					t.Fatalf("WriteAtFUA = %d, %v", n, err)
				}
				want++
			}
			if pinned {
				p := make([]byte, 4096)
				released := 0
				if n, err := pw.WritePinned(p, 0, func() { released++ }); n != len(p) || err != nil {
					t.Fatalf("WritePinned = %d, %v", n, err)
				}
				if released != 1 || len(got) != len(p) || &got[0] != &p[0] {
					t.Fatalf("WritePinned: released %d times, device got the caller's buffer: %v", released, len(got) == len(p) && &got[0] == &p[0])
				}
				want++
			}
			if c := counterValue(t, m.byCmd[cmdWrite].requests); c != want {
				t.Fatalf("write requests counted %v, want %v", c, want)
			}
		})
	}
	d := instrumentDevice(arrayDevice{}, newRequestMetrics())
	if _, ok := d.(nbd.FUAWriter); !ok {
		t.Error("the wrapped array is no FUAWriter")
	}
	if _, ok := d.(nbd.PinnedWriter); !ok {
		t.Error("the wrapped array is no PinnedWriter")
	}
	if _, ok := d.(nbd.WriteExpecter); !ok {
		t.Error("the wrapped array is no WriteExpecter: the server's hints would not reach the stripe cache")
	}
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// scrape fetches url and parses the text exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing the scrape: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the series of family name whose labels include labels
// ("k", "v" pairs), failing the test if there is none.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s in the scrape", name)
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v in the scrape", name, labels)
	return 0
}

// TestMetricsScrape serves the metrics of a made-up status and a device that saw some requests,
// scrapes them over HTTP as Prometheus would and checks every documented name and the values.
func TestMetricsScrape(t *testing.T) {
	st := raid.Status{
		State: raid.StateDegraded, Size: 3 << 20, Dirty: true, Missing: []int{2},
		Members: []raid.MemberStatus{
			{Path: "/m0", State: raid.MemberActive, ReadErrors: 3, Direct: true},
			{Path: "/m1", State: raid.MemberActive, WriteErrors: 1, Remote: &raid.MemberReport{
				Kind: "nbd", State: member.LinkReconnecting, Server: "x1", ServerName: "canonical-x1", Features: []string{"flush", "fua"},
				MinBlock: 1, PreferredBlock: 4096, MaxBlock: 32 << 20, Conns: 2, Reconnects: 3, InFlight: 4,
				Requests: 100, Errors: 5, RequestTime: 2 * time.Second,
				WriteBatches: 40, RequestsWritten: 101, ReplyReads: 60, Replies: 99,
				Latency: member.Latency{Window: 10 * time.Second, Requests: 50, Mean: 3 * time.Millisecond, Max: 40 * time.Millisecond},
			}},
			{Path: "/m2", State: raid.MemberFaulty},
			{Path: "/m2", State: raid.MemberFaulty}, // a duplicate path must not break the scrape
			{Path: "/m3", State: raid.MemberRebuilding},
		},
		Sync:        &raid.Progress{Kind: "rebuild", Done: 1 << 20, Total: 4 << 20},
		LastScrub:   &raid.Progress{Kind: "check", Done: 4 << 20, Total: 4 << 20, Mismatches: 7},
		LastRebuild: &raid.Progress{Kind: "rebuild", Done: 5, Total: 9},
		Bitmap:      &raid.BitmapStatus{Regions: 100, Set: 4, Flushes: 12, Waits: 3},
		AutoReAdd:   []raid.AutoReAddProbe{{Member: "/m2", Probes: 3}, {Member: "/m9", Refused: true}, {Member: "/m8"}},
		Counters: raid.Counters{FullStripeWrites: 10, RMWWrites: 2, RCWWrites: 3, MemberBytesRead: 4096, MappedBytesRead: 2048, MappedBytesWritten: 1024, PlacedBytes: 768,
			MemberBytesWritten: 8192, CopiedBytes: 512, CacheHits: 5, CacheMisses: 6, CacheEvictions: 7,
			WriteThroughs: 8, CacheStripes: 256},
	}
	bufs := nbd.BufferStats{Mapped: 1 << 20, Pinned: 2, PinnedWrites: 9}
	rm := newRequestMetrics()
	reg, err := newMetricsRegistry(newArrayCollector(func() raid.Status { return st },
		func() nbd.BufferStats { return bufs }), rm)
	if err != nil {
		t.Fatal(err)
	}
	d := instrumentDevice(&fakeDevice{failAt: 4096}, rm)
	for i := range 3 {
		d.WriteAt(make([]byte, 4096), int64(i)*4096) // the second fails
	}
	d.ReadAt(make([]byte, 1024), 0)
	d.Flush()
	d.Trim(0, 1<<20)
	d.WriteZeroes(0, 65536, false)

	ln, err := listenMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveMetrics(ln, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	url := "http://" + ln.Addr().String() + "/metrics"
	fams := scrape(t, url)

	var missing []string
	for _, name := range documentedMetrics {
		if fams[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("documented metrics missing from the scrape: %v", missing)
	}
	var undocumented []string
	for name := range fams {
		if strings.HasPrefix(name, "raid5d_") && !contains(documentedMetrics, name) {
			undocumented = append(undocumented, name)
		}
	}
	if len(undocumented) > 0 {
		sort.Strings(undocumented)
		t.Errorf("metrics not in the documented list: %v", undocumented)
	}

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"raid5d_array_state", []string{"state", "degraded"}, 1},
		{"raid5d_array_state", []string{"state", "clean"}, 0},
		{"raid5d_array_state", []string{"state", "active"}, 0},
		{"raid5d_array_size_bytes", nil, 3 << 20},
		{"raid5d_array_dirty", nil, 1},
		{"raid5d_array_missing_roles", nil, 1},
		{"raid5d_array_members", []string{"state", "active"}, 2},
		{"raid5d_array_members", []string{"state", "faulty"}, 2},
		{"raid5d_array_members", []string{"state", "rebuilding"}, 1},
		{"raid5d_array_members", []string{"state", "spare"}, 0},
		{"raid5d_member_state", []string{"member", "/m3", "state", "rebuilding"}, 1},
		{"raid5d_member_state", []string{"member", "/m3", "state", "active"}, 0},
		{"raid5d_member_read_errors_total", []string{"member", "/m0"}, 3},
		{"raid5d_member_write_errors_total", []string{"member", "/m1"}, 1},
		{"raid5d_sync_running", []string{"op", "rebuild"}, 1},
		{"raid5d_sync_done_bytes", []string{"op", "rebuild"}, 1 << 20}, // the running one, not the last
		{"raid5d_sync_total_bytes", []string{"op", "rebuild"}, 4 << 20},
		{"raid5d_sync_running", []string{"op", "scrub"}, 0},
		{"raid5d_sync_done_bytes", []string{"op", "scrub"}, 4 << 20},
		{"raid5d_sync_mismatches", []string{"op", "scrub"}, 7},
		{"raid5d_sync_total_bytes", []string{"op", "resync"}, 0},
		{"raid5d_full_stripe_writes_total", nil, 10},
		{"raid5d_rmw_writes_total", nil, 2},
		{"raid5d_rcw_writes_total", nil, 3},
		{"raid5d_member_read_bytes_total", nil, 4096},
		{"raid5d_member_mapped_read_bytes_total", nil, 2048},
		{"raid5d_member_written_bytes_total", nil, 8192},
		{"raid5d_member_mapped_written_bytes_total", nil, 1024},
		{"raid5d_placed_write_bytes_total", nil, 768},
		{"raid5d_cache_copied_bytes_total", nil, 512},
		{"raid5d_cache_hits_total", nil, 5},
		{"raid5d_cache_misses_total", nil, 6},
		{"raid5d_cache_evictions_total", nil, 7},
		{"raid5d_cache_write_throughs_total", nil, 8},
		{"raid5d_cache_capacity_stripes", nil, 256},
		{"raid5d_bitmap_flushes_total", nil, 12},
		{"raid5d_bitmap_waits_total", nil, 3},
		{"raid5d_bitmap_regions", nil, 100},
		{"raid5d_bitmap_regions_dirty", nil, 4},
		{"raid5d_nbd_buffers_mapped_bytes", nil, 1 << 20},
		{"raid5d_nbd_buffers_pinned", nil, 2},
		{"raid5d_nbd_pinned_writes_total", nil, 9},
		{"raid5d_requests_total", []string{"cmd", "write"}, 3},
		{"raid5d_request_errors_total", []string{"cmd", "write"}, 1},
		{"raid5d_request_bytes_total", []string{"cmd", "write"}, 8192},
		{"raid5d_request_duration_seconds", []string{"cmd", "write"}, 3},
		{"raid5d_requests_total", []string{"cmd", "read"}, 1},
		{"raid5d_request_bytes_total", []string{"cmd", "read"}, 1024},
		{"raid5d_requests_total", []string{"cmd", "flush"}, 1},
		{"raid5d_request_bytes_total", []string{"cmd", "trim"}, 1 << 20},
		{"raid5d_request_bytes_total", []string{"cmd", "write_zeroes"}, 65536},
		{"raid5d_request_errors_total", []string{"cmd", "read"}, 0},
		{"raid5d_member_direct", []string{"member", "/m0"}, 1},
		{"raid5d_member_direct", []string{"member", "/m1"}, 0},
		{"raid5d_member_direct", []string{"member", "/m3"}, 0},
		{"raid5d_remote_member_info", []string{"member", "/m1", "kind", "nbd", "export", "x1", "flags", "flush,fua", "server_name", "canonical-x1"}, 1},
		{"raid5d_remote_member_link", []string{"member", "/m1", "state", "reconnecting"}, 1},
		{"raid5d_remote_member_link", []string{"member", "/m1", "state", "connected"}, 0},
		{"raid5d_remote_member_block_size_bytes", []string{"member", "/m1", "size", "preferred"}, 4096},
		{"raid5d_remote_member_block_size_bytes", []string{"member", "/m1", "size", "max"}, 32 << 20},
		{"raid5d_remote_member_connections", []string{"member", "/m1"}, 2},
		{"raid5d_remote_member_reconnects_total", []string{"member", "/m1"}, 3},
		{"raid5d_remote_member_requests_in_flight", []string{"member", "/m1"}, 4},
		{"raid5d_remote_member_requests_total", []string{"member", "/m1"}, 100},
		{"raid5d_remote_member_request_errors_total", []string{"member", "/m1"}, 5},
		{"raid5d_remote_member_request_seconds_total", []string{"member", "/m1"}, 2},
		{"raid5d_remote_member_write_batches_total", []string{"member", "/m1"}, 40},
		{"raid5d_remote_member_requests_written_total", []string{"member", "/m1"}, 101},
		{"raid5d_remote_member_reply_reads_total", []string{"member", "/m1"}, 60},
		{"raid5d_remote_member_replies_total", []string{"member", "/m1"}, 99},
		{"raid5d_remote_member_latency_mean_seconds", []string{"member", "/m1"}, 0.003},
		{"raid5d_remote_member_latency_max_seconds", []string{"member", "/m1"}, 0.04},
		{"raid5d_auto_re_add_members", []string{"state", "probing"}, 2},
		{"raid5d_auto_re_add_members", []string{"state", "refused"}, 1},
	} {
		t.Run(c.name+strings.Join(c.labels, "_"), func(t *testing.T) {
			if got := value(t, fams, c.name, c.labels...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
			}
		})
	}
	if n := len(fams["raid5d_member_state"].GetMetric()); n != 4*len(memberStates) {
		t.Errorf("raid5d_member_state has %d series, want %d (one per path and state)", n, 4*len(memberStates))
	}

	if n := len(fams["raid5d_remote_member_info"].GetMetric()); n != 1 {
		t.Errorf("raid5d_remote_member_info has %d series, want 1 (the one remote member)", n)
	}

	// Without a bitmap its metrics are absent, the rest still there; without --auto-re-add its
	// metric too.
	st.Bitmap, st.AutoReAdd = nil, nil
	fams = scrape(t, url)
	if fams["raid5d_bitmap_flushes_total"] != nil || fams["raid5d_array_state"] == nil {
		t.Errorf("without a bitmap: bitmap metrics present %v, array state present %v",
			fams["raid5d_bitmap_flushes_total"] != nil, fams["raid5d_array_state"] != nil)
	}
	if fams["raid5d_auto_re_add_members"] != nil {
		t.Error("without --auto-re-add: raid5d_auto_re_add_members present")
	}

	stop()
	if resp, err := http.Get(url); err == nil {
		resp.Body.Close()
		t.Fatalf("after stop, GET %s answered %s", url, resp.Status)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestMetricsLoopbackOnly: --metrics refuses addresses other hosts could reach.
func TestMetricsLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:0", true},
		{"localhost:0", true},
		{"[::1]:0", true},
		{"0.0.0.0:0", false},
		{":0", false},
		{"192.0.2.1:9100", false},
		{"127.0.0.1", false}, // no port
	} {
		t.Run(tc.addr, func(t *testing.T) {
			ln, err := listenMetrics(tc.addr)
			if ln != nil {
				ln.Close()
			}
			if tc.ok && err != nil && !strings.Contains(tc.addr, "::1") {
				t.Fatalf("listenMetrics(%q): %v", tc.addr, err)
			}
			if !tc.ok && !errors.Is(err, errUsage) {
				t.Fatalf("listenMetrics(%q) = %v, want errUsage", tc.addr, err)
			}
		})
	}
}

// fakeBS answers BlockStatus with one hole of the asked length.
type fakeBS struct{ *fakeDevice }

func (d fakeBS) BlockStatus(off, length int64, dst []nbd.Extent) ([]nbd.Extent, error) {
	return append(dst[:0], nbd.Extent{Length: length, Flags: nbd.ExtentHole | nbd.ExtentZero}), nil
}

// fakeAll has every optional interface.
type fakeAll struct {
	fakeFUAPinned
	fakeBS
}

func (d fakeAll) ReadAt(p []byte, off int64) (int, error)  { return d.fakeBS.ReadAt(p, off) }
func (d fakeAll) WriteAt(p []byte, off int64) (int, error) { return d.fakeBS.WriteAt(p, off) }
func (d fakeAll) Size() (int64, error)                     { return d.fakeBS.Size() }
func (d fakeAll) Flush() error                             { return d.fakeBS.Flush() }
func (d fakeAll) Trim(off, length int64) error             { return d.fakeBS.Trim(off, length) }
func (d fakeAll) WriteZeroes(off, length int64, noHole bool) error {
	return d.fakeBS.WriteZeroes(off, length, noHole)
}

// TestInstrumentDeviceBlockStatus: the wrapper is a BlockStatuser exactly when the device is,
// alone or with the other optional interfaces, passes the device's answer through, and counts
// each call as a block_status request of the length described; the array itself gets all three.
func TestInstrumentDeviceBlockStatus(t *testing.T) {
	var got []byte
	base := &fakeDevice{failAt: -1}
	all := fakeAll{fakeFUAPinned{fakeFUA{base}, fakePinned{base, &got}}, fakeBS{base}}
	for _, tc := range []struct {
		name             string
		dev              nbd.Device
		fua, pinned, bsw bool
	}{
		{"plain", base, false, false, false},
		{"fua+pinned", fakeFUAPinned{fakeFUA{base}, fakePinned{base, &got}}, true, true, false},
		{"block status", fakeBS{base}, false, false, true},
		{"all", all, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newRequestMetrics()
			d := instrumentDevice(tc.dev, m)
			_, fua := d.(nbd.FUAWriter)
			_, pinned := d.(nbd.PinnedWriter)
			bs, bsw := d.(nbd.BlockStatuser)
			if fua != tc.fua || pinned != tc.pinned || bsw != tc.bsw {
				t.Fatalf("wrapped: FUAWriter %v PinnedWriter %v BlockStatuser %v, want %v %v %v",
					fua, pinned, bsw, tc.fua, tc.pinned, tc.bsw)
			}
			if !bsw {
				return
			}
			ext, err := bs.BlockStatus(4096, 1<<16, make([]nbd.Extent, 0, 8))
			if err != nil || len(ext) != 1 || ext[0].Length != 1<<16 || ext[0].Flags != nbd.ExtentHole|nbd.ExtentZero {
				t.Fatalf("BlockStatus = %+v, %v", ext, err)
			}
			if c := counterValue(t, m.byCmd[cmdBlockStatus].requests); c != 1 {
				t.Errorf("block_status requests %v, want 1", c)
			}
			if c := counterValue(t, m.byCmd[cmdBlockStatus].bytes); c != 1<<16 {
				t.Errorf("block_status bytes %v, want %d", c, 1<<16)
			}
			if n, err := d.ReadAt(make([]byte, 512), 0); n != 512 || err != nil {
				t.Errorf("ReadAt through the combined wrapper: %d, %v", n, err)
			}
			if c := counterValue(t, m.byCmd[cmdRead].requests); c != 1 {
				t.Errorf("read requests %v, want 1", c)
			}
		})
	}
	if _, ok := instrumentDevice(arrayDevice{}, newRequestMetrics()).(nbd.BlockStatuser); !ok {
		t.Error("the wrapped array is no BlockStatuser")
	}
}
