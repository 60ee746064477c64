package test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// r5Remote is the part of `raid5d status --json` on remote members that the tests read.
type r5Remote struct {
	Members []r5RemoteMember `json:"members"`
}

type r5RemoteMember struct {
	Path   string `json:"path"`
	State  string `json:"state"`
	Direct bool   `json:"direct"`
	Remote *struct {
		Kind        string   `json:"kind"`
		State       string   `json:"state"`
		Export      string   `json:"export"`
		ServerName  string   `json:"server_name"`
		Flags       []string `json:"flags"`
		MaxBlock    int64    `json:"max_block"`
		Connections int      `json:"connections"`
		InFlight    int64    `json:"in_flight"`
		Requests    uint64   `json:"requests"`
		Errors      uint64   `json:"request_errors"`
		Seconds     float64  `json:"request_seconds"`
		Latency     struct {
			Window float64 `json:"window_seconds"`
			Mean   float64 `json:"mean_seconds"`
			Max    float64 `json:"max_seconds"`
		} `json:"latency"`
	} `json:"remote"`
}

// member returns the member at path, failing the test if it is not listed with a remote
// report.
func (st *r5Remote) member(t *testing.T, path string) *r5RemoteMember {
	t.Helper()
	i := slices.IndexFunc(st.Members, func(m r5RemoteMember) bool { return m.Path == path })
	if i < 0 || st.Members[i].Remote == nil {
		t.Fatalf("member %s: no remote status in %+v", path, st.Members)
	}
	return &st.Members[i]
}

func (s *server) remoteStatus() *r5Remote {
	s.t.Helper()
	out, errOut, code := s.manageSplit("status", "--json")
	var st r5Remote
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("raid5d status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	return &st
}

// TestRemoteStatus: `raid5d status` (text and --json) and the metrics of a daemon whose
// members are served by nbdkit (file plugin, unix sockets) and nbd-server (TCP) show per
// member its export's name (and the name the server reports, where it sends one), the server's flags, one connection, the requests it answered
// (more after the client's I/O), their time and the link's state: connected, and down once
// that member's server is SIGKILLed, the member failed and no request waits for it.
func TestRemoteStatus(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, uris(ms)...)...)
	a := &array{dir: t.TempDir(), members: uris(ms)}
	s := a.serve(t, "--metrics", "127.0.0.1:0", "--stripe-cache", "off", "--member-timeout", "5s")
	addr := metricsAddress(t, s)
	before := s.remoteStatus()

	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := make([]byte, 4<<20)
	rand.NewChaCha8([32]byte{9}).Read(data)
	if err := c.writeAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.readAt(0, uint32(len(data))); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, data))
	}

	st := s.remoteStatus()
	for i, m := range ms {
		// nbdkit names the export in NBD_INFO_NAME; nbd-server sends none (3.2x).
		want := "m" + string(rune('0'+i))
		if m.nbdServer {
			want = ""
		}
		if got := st.member(t, m.uri).Remote.ServerName; got != want {
			t.Errorf("member %s: server_name %q, want %q", m.uri, got, want)
		}
		if st.member(t, m.uri).Direct {
			t.Errorf("remote member %s: direct true", m.uri)
		}
		r, was := st.member(t, m.uri).Remote, before.member(t, m.uri).Remote
		if r.Kind != "nbd" || r.State != "connected" || r.Export != "m"+string(rune('0'+i)) || r.Connections != 1 ||
			!slices.Contains(r.Flags, "flush") || !slices.Contains(r.Flags, "fua") || r.MaxBlock <= 0 {
			t.Errorf("member %s: remote %+v, want nbd, connected, export m%d, 1 connection, flush and fua", m.uri, r, i)
		}
		if r.Requests <= was.Requests || r.Errors != 0 || r.InFlight != 0 || r.Seconds <= 0 ||
			r.Latency.Window <= 0 || r.Latency.Mean > r.Latency.Max {
			t.Errorf("member %s after 4 MiB written and read: %+v (before: %d requests)", m.uri, r, was.Requests)
		}
	}
	out := s.mustManage("status")
	for i, m := range ms {
		if !strings.Contains(out, m.uri+" (role ") || !strings.Contains(out, `export "m`+string(rune('0'+i))+`"`) {
			t.Errorf("status shows no remote section for %s:\n%s", m.uri, out)
		}
	}
	if !strings.Contains(out, "remote members:") || !strings.Contains(out, "latency:") {
		t.Errorf("status has no remote members' section:\n%s", out)
	}
	fams := scrapeMetrics(t, addr)
	for _, m := range ms {
		if v := sample(t, fams, "raid5d_remote_member_requests_total", "member", m.uri); v <= 0 {
			t.Errorf("raid5d_remote_member_requests_total{member=%q} = %v", m.uri, v)
		}
		// Every request went in some batch, every reply came in some read.
		b, w := sample(t, fams, "raid5d_remote_member_write_batches_total", "member", m.uri), sample(t, fams, "raid5d_remote_member_requests_written_total", "member", m.uri)
		r, n := sample(t, fams, "raid5d_remote_member_reply_reads_total", "member", m.uri), sample(t, fams, "raid5d_remote_member_replies_total", "member", m.uri)
		if b <= 0 || w < b || r <= 0 || n <= 0 {
			t.Errorf("%s: %v requests in %v write batches, %v replies in %v reads", m.uri, w, b, n, r)
		}
		if v := sample(t, fams, "raid5d_remote_member_connections", "member", m.uri); v != 1 {
			t.Errorf("raid5d_remote_member_connections{member=%q} = %v, want 1", m.uri, v)
		}
	}

	// Member 2's server is lost: the member fails at the next write that reaches it; its link
	// is down.
	ms[2].p.stop(syscall.SIGKILL, stopGrace)
	if err := c.writeAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	s.waitStatus("member 2 failed", time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(ms[2].uri)
		return state == "faulty"
	})
	// Down once no request waits for a reconnect any more (the last within a member timeout).
	waitFor(t, "member 2's link down", time.Minute, s.proc, func() bool {
		r := s.remoteStatus().member(t, ms[2].uri).Remote
		return r.State == "down" && r.Connections == 0 && r.InFlight == 0
	})
	fams = scrapeMetrics(t, addr)
	for _, m := range fams["raid5d_remote_member_link"].GetMetric() {
		var member, state string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "member":
				member = l.GetValue()
			case "state":
				state = l.GetValue()
			}
		}
		if member == ms[2].uri && state == "down" && m.GetGauge().GetValue() != 1 {
			t.Errorf("raid5d_remote_member_link{member=%q,state=\"down\"} = %v, want 1", member, m.GetGauge().GetValue())
		}
	}
	c.disconnect()
	s.stop()
}
