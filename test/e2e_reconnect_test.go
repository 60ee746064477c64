package test

import (
	"encoding/json"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// reconnects is member path's reconnect count in `raid5d status --json`.
func (s *server) reconnects(path string) uint64 {
	s.t.Helper()
	out, errOut, code := s.manageSplit("status", "--json")
	var st struct {
		Members []struct {
			Path   string `json:"path"`
			Remote *struct {
				Reconnects uint64 `json:"reconnects"`
			} `json:"remote"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("raid5d status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	for _, m := range st.Members {
		if m.Path == path && m.Remote != nil {
			return m.Remote.Reconnects
		}
	}
	s.t.Fatalf("member %s: no remote status in %s", path, out)
	return 0
}

// TestRemoteMemberRestart: a member's server (nbdkit) restarted while the array is idle with
// everything flushed is reconnected to: the member stays active, reconnects is 1, every byte
// reads back and writes go on. Restarted with writes acknowledged and not yet flushed (no
// stripe cache: every write reaches the members at once), the member is failed instead of
// trusted, and the array goes on degraded with every byte intact.
func TestRemoteMemberRestart(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, uris(ms)...)...)
	a := &array{dir: t.TempDir(), members: uris(ms)}
	s := a.serve(t, "--member-timeout", "20s", "--stripe-cache", "off")
	const size = 8 << 20
	model := make([]byte, size) // the second half zeroes until it is written
	rand.NewChaCha8([32]byte{29}).Read(model[:size/2])
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	verify := func(what string) {
		t.Helper()
		if err := checkModel(c, model); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	write := func(from, to int) {
		t.Helper()
		if err := putModel(c, model, from, to); err != nil {
			t.Fatal(err)
		}
	}
	write(0, size/2)
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	// Idle: the bitmap cleared (raid's 3 s clear delay, its FUA writes and FLUSH), so that
	// nothing reaches the members any more.
	time.Sleep(6 * time.Second)

	ms[0].p.stop(syscall.SIGKILL, stopGrace)
	ms[0].start(t)
	verify("after member 0's server restarted")
	rand.NewChaCha8([32]byte{30}).Read(model[size/2:])
	write(size/2, size)
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	verify("written after the restart")
	if st := s.status(); !st.healthy() {
		t.Fatalf("after a restart with nothing unflushed: %+v, want every member active", st)
	}
	if n := s.reconnects(ms[0].uri); n != 1 {
		t.Errorf("member 0: %d reconnects, want 1", n)
	}

	// Writes acknowledged, no FLUSH yet: a restart may have lost them.
	rand.NewChaCha8([32]byte{31}).Read(model[:size/2])
	write(0, size/2)
	ms[0].p.stop(syscall.SIGKILL, stopGrace)
	ms[0].start(t)
	write(size/2-1<<20, size/2) // reaches member 0: the member is failed, the write is not
	s.waitStatus("member 0 to be failed", time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(ms[0].uri)
		return state == "faulty"
	})
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	verify("degraded, member 0 failed")
	if st := s.status(); st.State != "degraded" {
		t.Errorf("array %q with member 0 failed, want degraded", st.State)
	}
	c.disconnect()
	s.stop()
}
