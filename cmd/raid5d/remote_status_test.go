package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

// TestRemoteMemberStatus: an array over three exports served by nbdtest and a file opened
// with O_DIRECT, written and read through, as `raid5d status` (text and --json, through the
// daemon's control server) and the metrics show it: per remote member its export's name as
// the URI asks for it and as the server reports it (NBD_INFO_NAME: the first URI asks for the
// default export, which the server names), the server's flags (decoded) and block sizes, one
// connection, requests counted (more after more I/O), latency, no reconnects, link connected;
// the local-only fields stay absent for a member that is a file; which member is direct.
func TestRemoteMemberStatus(t *testing.T) {
	dir, err := os.MkdirTemp("", "r5rs") // unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const memberSize = raid.DataOffset + 64*4096
	export := func(i int) string { // the name the URI asks for: member 0 the server's default
		if i == 0 {
			return ""
		}
		return fmt.Sprintf("disk%d", i)
	}
	var specs []string
	for i := range 3 {
		dev := nbdtest.FUADevice{MemDevice: nbdtest.NewMemDevice(memberSize)}
		srv, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: fmt.Sprintf("disk%d", i), Device: dev,
			MinBlock: 512, PreferredBlock: 4096, MaxBlock: 1 << 20}}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, fmt.Sprintf("nbd+unix:///%s?socket=%s", export(i), nbdtest.ServeUnix(t, srv)))
	}
	local := filepath.Join(dir, "m3.img")
	specs = append(specs, local)
	member.SetDirect(member.DirectOn) // the file direct (the temporary directory's file system permitting)
	a, err := raid.Create(specs, raid.CreateOptions{Chunk: 4096, MemberSize: memberSize, IOOptions: raid.IOOptions{StripeCache: -1}})
	member.SetDirect(member.DirectAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	p := aligned.Make(3 * 4096 * 8)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(dir, "c.sock")
	ln, err := control.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- controlServer(a, control.Daemon{PID: 7, Export: "r"}, slog.New(slog.DiscardHandler)).Serve(ctx, ln)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	jsonStatus := func() control.Status {
		t.Helper()
		code, out, errOut := runCLI(t, "status", "--json", "--control", sock)
		var st control.Status
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
			t.Fatalf("status --json: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		return st
	}
	st := jsonStatus()
	var before []uint64
	for i, m := range st.Members {
		r := m.Remote
		if i == 3 {
			if r != nil {
				t.Errorf("the local member %s has a remote report %+v", m.Path, r)
			}
			if !m.Direct {
				t.Errorf("the local member %s opened with DirectOn: direct false", m.Path)
			}
			continue
		}
		if r == nil {
			t.Fatalf("member %s: no remote report in %+v", m.Path, m)
		}
		if m.Direct {
			t.Errorf("remote member %s: direct true", m.Path)
		}
		if r.Kind != "nbd" || r.State != "connected" || r.Export != export(i) || r.ServerName != fmt.Sprintf("disk%d", i) || r.Connections != 1 || r.Reconnects != 0 {
			t.Errorf("member %s: %+v, want nbd, connected, export %q named disk%d by the server, 1 connection, no reconnects", m.Path, r, export(i), i)
		}
		for _, f := range []string{"flush", "fua", "trim", "write_zeroes"} {
			if !slices.Contains(r.Flags, f) {
				t.Errorf("member %s: flags %v lack %s", m.Path, r.Flags, f)
			}
		}
		if r.MinBlock != 512 || r.PreferredBlock != 4096 || r.MaxBlock != 1<<20 {
			t.Errorf("member %s: block sizes %d/%d/%d, want 512/4096/1048576", m.Path, r.MinBlock, r.PreferredBlock, r.MaxBlock)
		}
		// The superblock and bitmap writes of Create and the data written: many requests.
		if r.Requests < 8 || r.Errors != 0 || r.InFlight != 0 || r.RequestSeconds <= 0 ||
			r.Latency.Requests == 0 || r.Latency.MaxSeconds <= 0 || r.Latency.MeanSeconds <= 0 || r.Latency.MeanSeconds > r.Latency.MaxSeconds {
			t.Errorf("member %s: requests %+v", m.Path, r)
		}
		before = append(before, r.Requests)
	}
	if _, err := a.ReadAt(p, 0); err != nil {
		t.Fatal(err)
	}
	st = jsonStatus()
	for i := range 3 {
		if got := st.Members[i].Remote.Requests; got <= before[i] {
			t.Errorf("member %d: %d requests after a read of every member, %d before", i, got, before[i])
		}
	}

	code, out, errOut := runCLI(t, "status", "--control", sock)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s%s", code, out, errOut)
	}
	for i := range 3 {
		if !regexpLine(out, specs[i], fmt.Sprintf("role %d", i), "active", "connected", "1 connection", "0 reconnects") ||
			!regexpLine(out, "server:", fmt.Sprintf(`export %q`, export(i)), "flush fua", "write_zeroes", "min 512, preferred 4K, max 1M") {
			t.Errorf("status has no lines for remote member %d:\n%s", i, out)
		}
	}
	// The members table's IO column (ROLE PATH STATE EVENTS READ-ERRORS WRITE-ERRORS DEVICE IO).
	ioOf := func(path string) string {
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 8 && f[1] == path {
				return f[7]
			}
		}
		return ""
	}
	for i, want := range []string{"nbd", "nbd", "nbd", "direct"} {
		if got := ioOf(specs[i]); got != want {
			t.Errorf("members table: IO of %s is %q, want %q:\n%s", specs[i], got, want, out)
		}
	}
	if !regexpLine(out, `server:`, `export "" (the server names it "disk0"),`) || strings.Contains(out, `export "disk1" (the server names it`) {
		t.Errorf("status does not show the server's name of the default export (only where it differs from the URI's):\n%s", out)
	}
	if !regexpLine(out, "requests:", "0 in flight", "answered (0 failed)") || !regexpLine(out, "latency:", "mean", "max", "over the last") {
		t.Errorf("status shows no requests or latency:\n%s", out)
	}
	if strings.Contains(out, local+" (") {
		t.Errorf("status shows the local member among the remote ones:\n%s", out)
	}

	reg, err := newMetricsRegistry(newArrayCollector(a.Status, nil), newRequestMetrics())
	if err != nil {
		t.Fatal(err)
	}
	mln, err := listenMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveMetrics(mln, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer stop()
	fams := scrape(t, "http://"+mln.Addr().String()+"/metrics")
	for i := range 3 {
		m := specs[i]
		if v := value(t, fams, "raid5d_remote_member_requests_total", "member", m); v < float64(before[i]) {
			t.Errorf("%s: requests_total %v, want at least %d", m, v, before[i])
		}
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"raid5d_remote_member_info", []string{"member", m, "kind", "nbd", "export", export(i), "server_name", fmt.Sprintf("disk%d", i)}, 1},
			{"raid5d_member_direct", []string{"member", m}, 0},
			{"raid5d_remote_member_link", []string{"member", m, "state", "connected"}, 1},
			{"raid5d_remote_member_link", []string{"member", m, "state", "down"}, 0},
			{"raid5d_remote_member_block_size_bytes", []string{"member", m, "size", "max"}, 1 << 20},
			{"raid5d_remote_member_connections", []string{"member", m}, 1},
			{"raid5d_remote_member_reconnects_total", []string{"member", m}, 0},
			{"raid5d_remote_member_requests_in_flight", []string{"member", m}, 0},
			{"raid5d_remote_member_request_errors_total", []string{"member", m}, 0},
		} {
			if got := value(t, fams, c.name, c.labels...); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
			}
		}
		if v := value(t, fams, "raid5d_remote_member_request_seconds_total", "member", m); v <= 0 {
			t.Errorf("%s: request_seconds_total %v", m, v)
		}
	}
	if v := value(t, fams, "raid5d_member_direct", "member", local); v != 1 {
		t.Errorf("raid5d_member_direct of the direct file %s = %v, want 1", local, v)
	}
	for _, mf := range fams["raid5d_remote_member_info"].GetMetric() {
		for _, lp := range mf.GetLabel() {
			if lp.GetName() == "member" && lp.GetValue() == local {
				t.Errorf("the local member has a remote_member_info series")
			}
		}
	}
}

// TestStatusAutoReAdd: status says --auto-re-add is on and, per away member, how often it was
// probed, when the next probe comes and why the last did not re-add it, or that it was refused
// and is left to the operator.
func TestStatusAutoReAdd(t *testing.T) {
	f, sock := serveFake(t)
	code, out, _ := runCLI(t, "status", "--control", sock)
	if code != 0 || strings.Contains(out, "auto re-add") {
		t.Fatalf("without --auto-re-add: exit %d, and status mentions it:\n%s", code, out)
	}
	next := time.Now().Add(time.Hour)
	f.mu.Lock()
	f.st.AutoReAdd = &control.AutoReAdd{Members: []control.AutoReAddMember{}}
	f.mu.Unlock()
	if _, out, _ = runCLI(t, "status", "--control", sock); !strings.Contains(out, "auto re-add: on, no remote member away") {
		t.Errorf("no member away: status says\n%s", out)
	}
	f.mu.Lock()
	f.st.AutoReAdd.Members = []control.AutoReAddMember{
		{Member: "nbd://a/m1", Probes: 3, Next: &next, Error: "export unreachable"},
		{Member: "nbd://b/m2", Probes: 1, Refused: true, Error: "member belongs to another array"},
	}
	f.mu.Unlock()
	_, out, _ = runCLI(t, "status", "--control", sock)
	if !regexpLine(out, "nbd://a/m1", "3 probes", "next in 1h0m0s", "export unreachable") ||
		!regexpLine(out, "nbd://b/m2", "REFUSED", "left to the operator", "raid5d add", "another array") {
		t.Errorf("status does not show the probed and the refused member:\n%s", out)
	}
}
