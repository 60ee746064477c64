package test

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// foreignMemberFile makes a member file of another array (raid5d create on four fresh files)
// and returns the one of role i: what a server that lies about its export serves.
func foreignMemberFile(t *testing.T, i int) string {
	t.Helper()
	dir := t.TempDir()
	var files []string
	for j := range memberCount {
		f := filepath.Join(dir, "other"+string(rune('0'+j))+".img")
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, memberSize); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, files...)...)
	return files[i]
}

// TestRemoteMemberForeign: a member server that serves another array's member in place of the
// right one, of the same size and flags, is never trusted: serve refuses it, naming its URI and
// why; and a server that comes back after a restart with the foreign export behind the same
// URI fails the member at the reconnect (nothing it holds is read as the array's), so the
// array serves every byte degraded, from the others.
func TestRemoteMemberForeign(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, uris(ms)...)...)
	a := &array{dir: t.TempDir(), members: uris(ms)}
	own := ms[0].file
	foreign := foreignMemberFile(t, 0)

	// At assembly.
	ms[0].p.stop(syscall.SIGTERM, stopGrace)
	ms[0].file = foreign
	ms[0].start(t)
	sockDir, err := os.MkdirTemp("", "r5n")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	out, err := runToolErr(raid5dBin, append([]string{"serve", "--socket", filepath.Join(sockDir, "nbd.sock"),
		"--control", filepath.Join(sockDir, "control.sock")}, uris(ms)...)...)
	if err == nil || !strings.Contains(out, ms[0].uri) || !strings.Contains(out, "another array") {
		t.Fatalf("serve with member 0's server serving another array's member: %v\n%s\nwant an error naming %s and another array", err, out, ms[0].uri)
	}

	// At a reconnect.
	ms[0].p.stop(syscall.SIGTERM, stopGrace)
	ms[0].file = own
	ms[0].start(t)
	s := a.serve(t, "--member-timeout", "20s", "--stripe-cache", "off")
	const size = 8 << 20
	model := make([]byte, size)
	rand.NewChaCha8([32]byte{41}).Read(model)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := putModel(c, model, 0, size); err != nil {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	// Idle: the bitmap cleared, nothing unflushed: a restart of the server may be reconnected.
	time.Sleep(6 * time.Second)
	ms[0].p.stop(syscall.SIGKILL, stopGrace)
	ms[0].file = foreign
	ms[0].start(t)
	if err := checkModel(c, model); err != nil {
		t.Fatalf("after member 0's server came back with another array's member: %v", err)
	}
	st := s.waitStatus("member 0 failed", time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(ms[0].uri)
		return state == "faulty"
	})
	if st.State != "degraded" {
		t.Errorf("array %q with member 0's export replaced, want degraded", st.State)
	}
	c.disconnect()
	s.stop()
}
