package test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricsNames are the metric names the README documents. The bitmap ones are there because
// raid5d create gives arrays a write-intent bitmap by default.
var metricsNames = []string{
	"raid5d_array_state", "raid5d_array_size_bytes", "raid5d_array_dirty", "raid5d_array_write_hole",
	"raid5d_array_missing_roles", "raid5d_array_members",
	"raid5d_member_state", "raid5d_member_read_errors_total", "raid5d_member_write_errors_total",
	"raid5d_sync_running", "raid5d_sync_done_bytes", "raid5d_sync_total_bytes", "raid5d_sync_mismatches",
	"raid5d_full_stripe_writes_total", "raid5d_rmw_writes_total", "raid5d_rcw_writes_total",
	"raid5d_member_read_bytes_total", "raid5d_member_written_bytes_total",
	"raid5d_cache_copied_bytes_total", "raid5d_cache_hits_total", "raid5d_cache_misses_total",
	"raid5d_cache_evictions_total", "raid5d_cache_write_throughs_total", "raid5d_cache_capacity_stripes",
	"raid5d_bitmap_flushes_total", "raid5d_bitmap_waits_total", "raid5d_bitmap_regions", "raid5d_bitmap_regions_dirty",
	"raid5d_nbd_buffers_mapped_bytes", "raid5d_nbd_buffers_pinned", "raid5d_nbd_pinned_writes_total",
	"raid5d_requests_total", "raid5d_request_bytes_total", "raid5d_request_errors_total",
	"raid5d_request_duration_seconds",
}

// metricsAddress returns the address the daemon logged for --metrics.
func metricsAddress(t *testing.T, s *server) string {
	t.Helper()
	for _, r := range logRecords(t, s.out.String(), 0) {
		if r["msg"] == "metrics listening" {
			if a, ok := r["address"].(string); ok {
				return a
			}
		}
	}
	t.Fatalf("the daemon logged no metrics address:\n%s", s.out.String())
	return ""
}

// scrapeMetrics fetches and parses http://addr/metrics.
func scrapeMetrics(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// sample returns the value of the one series of family name with label key=value (or the only
// series, for key ""); a histogram's is its count.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name, key, value string) float64 {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		match := key == ""
		for _, l := range m.GetLabel() {
			match = match || l.GetName() == key && l.GetValue() == value
		}
		if !match {
			continue
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
	t.Fatalf("no series %s{%s=%q} in /metrics", name, key, value)
	return 0
}

// TestMetrics serves an array with --metrics (and stable pages, so writes go through the
// pinned path of the instrumented device), runs fio and checks the scrape: every documented
// name, and requests and bytes that match what fio wrote.
func TestMetrics(t *testing.T) {
	need(t, "fio")
	if standin {
		t.Skip("raid5d's metrics only")
	}
	a := newArray(t)
	s := a.serve(t, "--metrics", "127.0.0.1:0", "--stable-pages")
	addr := metricsAddress(t, s)
	if sample(t, scrapeMetrics(t, addr), "raid5d_requests_total", "cmd", "write") != 0 {
		t.Fatal("writes counted before any client wrote")
	}

	jobs := runFio(t, s.uri, "seq4k.fio")
	var written int64
	for _, j := range jobs {
		written += j.Write.IOBytes
	}
	fams := scrapeMetrics(t, addr)
	var missing []string
	for _, name := range metricsNames {
		if fams[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("documented metrics missing from /metrics: %s", strings.Join(missing, ", "))
	}
	writes := sample(t, fams, "raid5d_requests_total", "cmd", "write")
	if writes <= 0 {
		t.Fatalf("raid5d_requests_total{cmd=\"write\"} = %v after fio wrote %d bytes", writes, written)
	}
	if got := sample(t, fams, "raid5d_request_bytes_total", "cmd", "write"); got != float64(written) {
		t.Errorf("raid5d_request_bytes_total{cmd=\"write\"} = %v, fio wrote %d", got, written)
	}
	if got := sample(t, fams, "raid5d_request_duration_seconds", "cmd", "write"); got != writes {
		t.Errorf("write latency histogram counted %v requests, requests_total says %v", got, writes)
	}
	if got := sample(t, fams, "raid5d_request_errors_total", "cmd", "write"); got != 0 {
		t.Errorf("raid5d_request_errors_total{cmd=\"write\"} = %v, want 0", got)
	}
	if got := sample(t, fams, "raid5d_requests_total", "cmd", "flush"); got < 1 {
		t.Errorf("raid5d_requests_total{cmd=\"flush\"} = %v, fio ends with an fsync", got)
	}
	// The wrapper kept PinnedWriter: the server handed writes over by reference.
	if got := sample(t, fams, "raid5d_nbd_pinned_writes_total", "", ""); got != writes {
		t.Errorf("raid5d_nbd_pinned_writes_total = %v, want every write (%v) with --stable-pages", got, writes)
	}
	if got := sample(t, fams, "raid5d_full_stripe_writes_total", "", ""); got <= 0 {
		t.Errorf("raid5d_full_stripe_writes_total = %v after %d bytes of sequential writes", got, written)
	}
	if got := sample(t, fams, "raid5d_array_state", "state", "active"); got != 1 {
		t.Errorf("raid5d_array_state{state=\"active\"} = %v after writes, want 1", got)
	}
	if got := sample(t, fams, "raid5d_array_members", "state", "active"); got != memberCount {
		t.Errorf("raid5d_array_members{state=\"active\"} = %v, want %d", got, memberCount)
	}
	s.stop()
}
