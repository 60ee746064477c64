package test

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	if out := serveRefused(t, uris(ms)); !strings.Contains(out, ms[0].uri) || !strings.Contains(out, "another array") {
		t.Fatalf("serve with member 0's server serving another array's member:\n%s\nwant an error naming %s and another array", out, ms[0].uri)
	}

	// At a reconnect.
	ms[0].p.stop(syscall.SIGTERM, stopGrace)
	ms[0].file = own
	ms[0].start(t)
	s := a.serve(t, "--member-timeout", "20s", "--stripe-cache", "off")
	const size = 8 << 20
	model, c := modelClient(t, s, 41, size)
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

// serveRefused runs raid5d serve of members with flags, which must refuse to assemble the
// array: it fails the test if serve greets a client (it assembled) or has not exited within
// startTimeout, and returns serve's output.
func serveRefused(t *testing.T, members []string, flags ...string) string {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "r5n") // unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "nbd.sock")
	args := append([]string{"serve", "--socket", sock, "--control", filepath.Join(sockDir, "control.sock")}, flags...)
	p := startProc(t, raid5dBin, append(args, members...)...)
	deadline := time.Now().Add(startTimeout)
	for p.running() {
		if canDial("unix", sock) {
			p.stop(syscall.SIGTERM, stopGrace)
			t.Fatalf("serve assembled the array (want it refused):\n%s", p.out.String())
		}
		if time.Now().After(deadline) {
			p.stop(syscall.SIGKILL, stopGrace)
			t.Fatalf("serve neither refused nor served within %v:\n%s", startTimeout, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p.err == nil {
		t.Fatalf("serve exited with status 0 without serving (want an error):\n%s", p.out.String())
	}
	return p.out.String()
}

// router is an NBD server as a client sees it on one unix socket, passing each connection
// through byte for byte to one of two servers behind it: to the first (own), or, while split,
// every connection after the first since split was set to the second (other) — a server that
// routes one URI's connections to different disks.
type router struct {
	sock       string
	own, other string // the servers' unix sockets

	mu    sync.Mutex // guards split, n, conns
	split bool
	n     int        // connections since split was last set
	conns []net.Conn // every connection, both sides, closed when the test ends
	wg    sync.WaitGroup
}

// newRouter serves a router in front of own and other until the test ends.
func newRouter(t *testing.T, own, other string) *router {
	t.Helper()
	r := &router{sock: filepath.Join(filepath.Dir(own), "router.sock"), own: own, other: other}
	ln, err := net.Listen("unix", r.sock)
	if err != nil {
		t.Fatal(err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			r.pass(nc)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// setSplit sets whether connections after the next one go to other.
func (r *router) setSplit(split bool) {
	r.mu.Lock()
	r.split, r.n = split, 0
	r.mu.Unlock()
}

// pass connects nc to the server its number routes it to, and copies both ways until
// either side closes.
func (r *router) pass(nc net.Conn) {
	r.mu.Lock()
	to := r.own
	if r.split && r.n > 0 {
		to = r.other
	}
	r.n++
	sc, err := net.Dial("unix", to)
	if err != nil {
		r.mu.Unlock()
		nc.Close()
		return
	}
	r.conns = append(r.conns, nc, sc)
	r.mu.Unlock()
	copy := func(dst, src net.Conn) {
		defer r.wg.Done()
		io.Copy(dst, src)
		dst.Close() // the other direction's copy ends too
		src.Close()
	}
	r.wg.Add(2)
	go copy(sc, nc)
	go copy(nc, sc)
}

// TestRemoteMemberConnsRouted: with --member-conns 2, a member whose server routes the second
// connection to another array's member of the same size and flags (the first reaches the
// right one) is refused by serve at assembly, naming its URI and why, before any request
// reaches the wrong disk; routed honestly, the same member gets its two connections and the
// array holds every byte written.
func TestRemoteMemberConnsRouted(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	foreign := &remoteMember{file: foreignMemberFile(t, 0), sock: filepath.Join(filepath.Dir(ms[0].sock), "foreign.sock")}
	foreign.start(t)
	r := newRouter(t, ms[0].sock, foreign.sock)
	members := append([]string{"nbd+unix:///m0?socket=" + r.sock}, uris(ms[1:])...)
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, members...)...)

	r.setSplit(true)
	if out := serveRefused(t, members, "--member-conns", "2"); !strings.Contains(out, members[0]) || !strings.Contains(out, "another array") {
		t.Fatalf("serve with member 0's second connection routed to another array's member:\n%s\nwant an error naming %s and another array", out, members[0])
	}

	r.setSplit(false)
	a := &array{dir: t.TempDir(), members: members}
	s := a.serve(t, "--member-conns", "2", "--stripe-cache", "off")
	if n := s.remoteStatus().member(t, members[0]).Remote.Connections; n != 2 {
		t.Errorf("member 0 routed honestly: %d connections, want 2", n)
	}
	const size = 8 << 20
	model, c := modelClient(t, s, 43, size)
	if err := putModel(c, model, 0, size); err != nil {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	if err := checkModel(c, model); err != nil {
		t.Fatal(err)
	}
	c.disconnect()
	s.stop()
}
