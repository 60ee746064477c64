package test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/testpki"
)

// remoteMember is a member file served by nbdkit's file plugin on a unix socket or a TCP
// address, or by nbd-server on a TCP address: here (127.0.0.1), or on a host of a lab.
type remoteMember struct {
	file, uri string
	sock      string   // nbdkit's unix socket path
	addr      string   // the TCP address (host:port)
	nbdServer bool     // served by nbd-server (on addr), not nbdkit
	host      *netHost // the lab's host it is served on; nil: here
	p         *proc    // nbdkit
}

// reachable reports whether m's server accepts connections: from the lab's hub when m is on a
// lab's host.
func (m *remoteMember) reachable() bool {
	switch {
	case m.sock != "":
		return canDial("unix", m.sock)
	case m.host != nil:
		return m.host.lab.hub.canDial("tcp", m.addr)
	}
	return canDial("tcp", m.addr)
}

// start serves m.file until the test ends or it is stopped, and waits until the server
// accepts connections. extra are nbdkit's: options ("--filter=...", "--tls=..."), then keys.
func (m *remoteMember) start(t *testing.T, extra ...string) {
	t.Helper()
	if m.nbdServer {
		m.startNbdServer(t)
		return
	}
	args := []string{"--foreground"}
	if m.sock != "" {
		os.Remove(m.sock) // nbdkit leaves its socket behind when it stops
		args = append(args, "--unix", m.sock)
	} else {
		host, port, _ := net.SplitHostPort(m.addr)
		args = append(args, "--ipaddr", host, "--port", port)
	}
	var filters, keys []string
	for _, e := range extra {
		if strings.HasPrefix(e, "--") {
			filters = append(filters, e)
		} else {
			keys = append(keys, e)
		}
	}
	args = append(append(append(args, filters...), "file", "file="+m.file), keys...)
	m.p = startProcIn(t, m.host.prefix(), "nbdkit", args...)
	p := m.p
	t.Cleanup(func() { p.stop(syscall.SIGTERM, stopGrace) })
	waitFor(t, "nbdkit to accept", startTimeout, p, m.reachable)
}

// nbdkitAbort is how nbdkit 1.32 dies when a client vanishes with replies in flight: a worker
// thread sends a reply on the connection after another thread, whose send failed, has closed
// the connection's socket (the assertion is not in later nbdkit's server/connections.c).
const nbdkitAbort = "raw_send_socket: Assertion `sock >= 0' failed"

// afterClientKilled is for a member whose client (the daemon) was just SIGKILLed: it waits
// until m's nbdkit has let go of every connection of that client (no socket left but its
// listener), so that no request of the dead client's is still under way in it. If nbdkit died
// meanwhile of its own abort (nbdkitAbort; TestNetnsCrashLoop hit it under load), it is started
// again, as the member host's supervisor would, and the test says so; a death of any other
// cause fails t. The file behind it keeps every write nbdkit made (pwrite, then the abort).
func (m *remoteMember) afterClientKilled(t *testing.T) {
	t.Helper()
	if m.p == nil {
		return // nbd-server: a process per connection, which dies with it
	}
	p := m.p
	waitFor(t, "nbdkit to close the killed daemon's connections", startTimeout, nil, func() bool {
		return !p.running() || socketsOf(p.cmd.Process.Pid) <= 1
	})
	if p.running() {
		return
	}
	<-p.exited
	if !strings.Contains(p.out.String(), nbdkitAbort) {
		t.Fatalf("nbdkit of %s exited when its client was killed (%v):\n%s", m.uri, p.err, p.out.String())
	}
	t.Logf("nbdkit of %s aborted on its killed client's connection (%s, nbdkit's bug); started again", m.uri, nbdkitAbort)
	m.start(t)
}

// socketsOf counts the sockets process pid holds open (0 once it is gone).
func socketsOf(pid int) int {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// startNbdServer serves m.file with nbd-server (FLUSH and FUA on) on m.addr. nbd-server
// daemonizes: it is stopped by the PID in its pid file.
func (m *remoteMember) startNbdServer(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	host, port, _ := net.SplitHostPort(m.addr)
	conf := filepath.Join(dir, "nbd-server.conf")
	pidFile := filepath.Join(dir, "nbd-server.pid")
	name := strings.TrimPrefix(m.uri[strings.LastIndex(m.uri, "/"):], "/")
	text := fmt.Sprintf("[generic]\n\tlistenaddr = %s\n\tport = %s\n[%s]\n\texportname = %s\n\tflush = true\n\tfua = true\n",
		host, port, name, m.file)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	runToolIn(t, m.host.prefix(), "nbd-server", "-C", conf, "-p", pidFile)
	var pid int
	waitFor(t, "nbd-server's pid file", startTimeout, nil, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		_, err = fmt.Sscan(string(b), &pid)
		return err == nil && pid > 0
	})
	t.Cleanup(func() {
		syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(stopGrace)
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	})
	waitFor(t, "nbd-server to accept", startTimeout, nil, m.reachable)
}

func canDial(network, addr string) bool {
	c, err := net.Dial(network, addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// newRemoteMembers makes memberCount member files of memberSize bytes and serves them: the
// last with nbd-server over TCP on 127.0.0.1, the others with nbdkit over unix sockets.
func newRemoteMembers(t *testing.T) []*remoteMember {
	t.Helper()
	dir := t.TempDir()
	sockDir, err := os.MkdirTemp("", "r5n") // unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	var ms []*remoteMember
	for i := range memberCount {
		m := &remoteMember{file: filepath.Join(dir, fmt.Sprintf("m%d.img", i))}
		if err := os.WriteFile(m.file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(m.file, memberSize); err != nil {
			t.Fatal(err)
		}
		if i < memberCount-1 {
			m.sock = filepath.Join(sockDir, fmt.Sprintf("m%d.sock", i))
			m.uri = fmt.Sprintf("nbd+unix:///m%d?socket=%s", i, m.sock)
		} else {
			m.addr, m.nbdServer = freePort(t), true
			m.uri = fmt.Sprintf("nbd://%s/m%d", m.addr, i)
		}
		m.start(t)
		ms = append(ms, m)
	}
	return ms
}

// modelClient returns size bytes of random data from seed, the model a test writes and
// checks, and a client of s (closed when the test ends).
func modelClient(t *testing.T, s *server, seed byte, size int) ([]byte, *wireClient) {
	t.Helper()
	model := make([]byte, size)
	rand.NewChaCha8([32]byte{seed}).Read(model)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return model, c
}

// checkModel reads the export's first len(model) bytes through c, a MiB at a time, and
// compares every byte with model; the error names the offset of the read that failed or of
// the first byte that differs. It does not touch t, so a test's other goroutines can use it.
func checkModel(c *wireClient, model []byte) error {
	for off := 0; off < len(model); off += 1 << 20 {
		n := min(1<<20, len(model)-off)
		got, err := c.readAt(uint64(off), uint32(n))
		if err != nil {
			return fmt.Errorf("read at %d: %w", off, err)
		}
		if i := firstDiff(got, model[off:off+n]); i >= 0 {
			return fmt.Errorf("wrong data at byte %d", off+i)
		}
	}
	return nil
}

// putModel writes model[from:to) at the same offsets through c, a MiB at a time (from and
// to multiples of a MiB), without FUA; the error names the write that failed.
func putModel(c *wireClient, model []byte, from, to int) error {
	for off := from; off < to; off += 1 << 20 {
		if err := c.writeAt(model[off:off+1<<20], uint64(off), false); err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
	}
	return nil
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func uris(ms []*remoteMember) []string {
	var u []string
	for _, m := range ms {
		u = append(u, m.uri)
	}
	return u
}

// TestRemoteMembers: an array over four NBD exports (three served by nbdkit on unix sockets,
// one by nbd-server over TCP) holds every byte written through raid5d serve. Then, under a
// write load and a reader checking every byte, one member's server is lost: SIGKILLed (its
// connection breaks) or SIGSTOPped (it stops answering: only the requests' deadline gets the
// member's calls to return). The clients see no error and no wait much past one member
// timeout, the member is failed, the array goes on degraded with all data intact, and serve
// restarted without that server (gone, or not answering the handshake) assembles degraded —
// the export unreachable, a missing member — and reads everything back. Then the killed
// server comes back and `re-add` resyncs only what the bitmap marked, or (stopped) a spare on
// another export is added and rebuilt; every byte is read back again.
func TestRemoteMembers(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"SIGKILL": syscall.SIGKILL, "SIGSTOP": syscall.SIGSTOP} {
		t.Run(name, func(t *testing.T) { remoteMemberLost(t, sig) })
	}
}

func remoteMemberLost(t *testing.T, sig syscall.Signal) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, uris(ms)...)...)
	a := &array{dir: t.TempDir(), members: uris(ms)}
	const timeout = 3 * time.Second
	// No stripe cache: every read and write reaches the members.
	s := a.serve(t, "--member-timeout", timeout.String(), "--stripe-cache", "off")
	if st := s.status(); st.State != "clean" && st.State != "active" {
		t.Fatalf("array over remote members: state %q", st.State)
	}

	const size = 16 << 20
	model, c := modelClient(t, s, 17, size)
	const step = stripeData + 4096 // not stripe-aligned: partial stripes too
	verify := func(c *wireClient, what string, size int) {
		t.Helper()
		if err := checkModel(c, model[:size]); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for off := 0; off < size/2; off += step {
		if err := c.writeAt(model[off:min(off+step, size/2)], uint64(off), false); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	verify(c, "healthy", size/2)

	// A write load on the second half, from another client, while member 1's server is
	// SIGKILLed: no write fails, none waits much past one member timeout.
	loadErr := make(chan error, 1)
	stop := make(chan struct{})
	passes := make(chan int, 100)
	go func() {
		lc, err := wireConnect(s.sock)
		if err != nil {
			loadErr <- err
			return
		}
		defer lc.Close()
		for pass := 0; ; pass++ {
			for off := size / 2; off < size; off += step {
				n := min(step, size-off)
				t0 := time.Now()
				if err := lc.writeAt(model[off:off+n], uint64(off), false); err != nil {
					loadErr <- fmt.Errorf("pass %d: write at %d: %w", pass, off, err)
					return
				}
				if d := time.Since(t0); d > timeout+30*time.Second {
					loadErr <- fmt.Errorf("pass %d: write at %d took %v (member timeout %v)", pass, off, d, timeout)
					return
				}
			}
			if err := lc.flush(); err != nil {
				loadErr <- fmt.Errorf("pass %d: FLUSH: %w", pass, err)
				return
			}
			passes <- pass
			select {
			case <-stop:
				loadErr <- lc.disconnect()
				return
			default:
			}
		}
	}()
	// And a reader of the first half, checking every byte.
	readErr := make(chan error, 1)
	go func() {
		rc, err := wireConnect(s.sock)
		if err != nil {
			readErr <- err
			return
		}
		defer rc.Close()
		for {
			if err := checkModel(rc, model[:size/2]); err != nil {
				readErr <- err
				return
			}
			select {
			case <-stop:
				readErr <- rc.disconnect()
				return
			default:
			}
		}
	}()
	waitPass := func(what string) int {
		t.Helper()
		select {
		case p := <-passes:
			return p
		case err := <-loadErr:
			t.Fatalf("load %s: %v", what, err)
		case <-time.After(2 * time.Minute):
			t.Fatalf("load %s: no pass within 2 minutes", what)
		}
		return 0
	}
	waitPass("before the kill")
	time.Sleep(50 * time.Millisecond) // into the next pass
	if sig == syscall.SIGSTOP {
		t.Cleanup(func() { ms[1].p.cmd.Process.Signal(syscall.SIGCONT) }) // before nbdkit's stop
	}
	if err := ms[1].p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "member 1 to be failed", 2*time.Minute, s.proc, func() bool {
		state, _, _ := s.status().member(ms[1].uri)
		return state == "faulty"
	})
	if st := s.status(); st.State != "degraded" {
		t.Fatalf("array %q after member 1's server was lost, want degraded", st.State)
	}
	// Two more passes: at least one wholly after the member was failed.
	waitPass("after the kill")
	waitPass("degraded")
	close(stop)
	if err := <-loadErr; err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := <-readErr; err != nil {
		t.Fatalf("reader: %v", err)
	}
	verify(c, "degraded", size)
	c.disconnect()
	s.stop()

	// Restarted without member 1's server: the export is unreachable, a missing member.
	s = a.serve(t, "--member-timeout", timeout.String())
	if st := s.status(); st.State != "degraded" || len(st.Missing) != 1 || st.Missing[0] != 1 {
		t.Fatalf("restarted with member 1's server lost: state %q, missing %v; want degraded, [1]", st.State, st.Missing)
	}
	c2, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	verify(c2, "after the restart", size)

	if sig == syscall.SIGKILL {
		// The host comes back: member 1's server again, on the same file. re-add resyncs only
		// the regions the bitmap marked while it was away; then with member 0 failed every
		// byte reads back, role 0's through the re-added member's.
		ms[1].start(t)
		s.mustManage("re-add", ms[1].uri)
		s.waitStatus("the re-add to finish", 2*time.Minute, (*r5Status).healthy)
		lr := s.status().LastRebuild
		if lr == nil || !lr.ReAdd || lr.Resynced <= 0 || lr.Resynced >= lr.Total/2 {
			t.Fatalf("last rebuild %+v, want a re-add of the regions written while away (some, and under half)", lr)
		}
		t.Logf("re-add resynced %d of the member's %d bytes", lr.Resynced, lr.Total)
		s.mustManage("fail", ms[0].uri)
		verify(c2, "after the re-add, member 0 failed", size)
	} else {
		// A spare on another export takes the lost member's role: rebuilt over NBD, every
		// byte then read from it where it holds the data.
		spare := &remoteMember{file: ms[1].file + ".spare", sock: ms[1].sock + ".spare"}
		spare.uri = "nbd+unix:///spare?socket=" + spare.sock
		if err := os.WriteFile(spare.file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(spare.file, memberSize); err != nil {
			t.Fatal(err)
		}
		spare.start(t)
		s.mustManage("add", spare.uri)
		st := s.waitStatus("the rebuild onto the remote spare", 2*time.Minute, (*r5Status).healthy)
		if state, role, _ := st.member(spare.uri); state != "active" || role != 1 {
			t.Fatalf("the remote spare after the rebuild: %q in role %d, want active in role 1", state, role)
		}
		verify(c2, "after the rebuild", size)
	}
	c2.disconnect()
	s.stop() // before the member servers started since, whose cleanups come first
}

// TestRemoteMemberWrongSize: an export of the wrong size is refused, naming its URI: by create
// when it is too small for an array, by serve when it is smaller than the array recorded.
func TestRemoteMemberWrongSize(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	small := &remoteMember{file: filepath.Join(t.TempDir(), "small.img"), sock: filepath.Join(filepath.Dir(ms[0].sock), "small.sock")}
	small.uri = "nbd+unix:///small?socket=" + small.sock
	if err := os.WriteFile(small.file, make([]byte, 512<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	small.start(t)
	out, err := runToolErr(raid5dBin, append([]string{"create", "--chunk", "64K", small.uri}, uris(ms[1:])...)...)
	if err == nil || !strings.Contains(out, small.uri) {
		t.Fatalf("create with a 512 KiB export: %v\n%s\nwant an error naming %s", err, out, small.uri)
	}

	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, uris(ms)...)...)
	// Member 2's server now says its export is half the size.
	ms[2].p.stop(syscall.SIGTERM, stopGrace)
	ms[2].start(t, "--filter=truncate", fmt.Sprintf("truncate=%d", memberSize/2))
	if out := serveRefused(t, uris(ms)); !strings.Contains(out, ms[2].uri) || !strings.Contains(out, "too small") {
		t.Fatalf("serve with member 2's export shrunk:\n%s\nwant an error naming %s", out, ms[2].uri)
	}
}

// TestRemoteMembersTLS: members served by nbdkit over TLS only, with client certificates
// required: create and serve reach them with --member-tls-ca/-cert/-key (serve with three
// connections to each) and the array holds what is written; serve with a CA that did not sign
// the servers' certificates is refused with the TLS error and the URI (not assembled
// degraded, as for a missing member).
func TestRemoteMembersTLS(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit")
	pki := testpki.New(t)
	sockDir, err := os.MkdirTemp("", "r5n")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	dir := t.TempDir()
	var specs []string
	for i := range memberCount {
		m := &remoteMember{file: filepath.Join(dir, fmt.Sprintf("m%d.img", i)), sock: filepath.Join(sockDir, fmt.Sprintf("m%d.sock", i))}
		if err := os.WriteFile(m.file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(m.file, memberSize); err != nil {
			t.Fatal(err)
		}
		m.uri = fmt.Sprintf("nbds+unix:///m%d?socket=%s", i, m.sock)
		m.start(t, "--tls=require", "--tls-certificates="+pki.Dir, "--tls-verify-peer")
		specs = append(specs, m.uri)
	}
	tlsFlags := func(p *testpki.PKI) []string {
		return []string{"--member-tls-ca", p.Path(testpki.CACert), "--member-tls-cert", p.Path(testpki.ClientCert), "--member-tls-key", p.Path(testpki.ClientKey)}
	}
	runTool(t, raid5dBin, append(append([]string{"create", "--chunk", "64K"}, tlsFlags(pki)...), specs...)...)
	a := &array{dir: dir, members: specs}
	s := a.serve(t, append(tlsFlags(pki), "--member-conns", "3")...) // nbdkit advertises CAN_MULTI_CONN
	model, c := modelClient(t, s, 23, 4<<20)
	if err := c.writeAt(model, 0, true); err != nil {
		t.Fatal(err)
	}
	got, err := c.readAt(0, uint32(len(model)))
	if err != nil || !bytes.Equal(got, model) {
		t.Fatalf("read back over TLS members: %v (equal %v)", err, bytes.Equal(got, model))
	}
	c.disconnect()
	s.stop()

	other := testpki.New(t)
	out, err := runToolErr(raid5dBin, append(append([]string{"serve", "--socket", filepath.Join(sockDir, "nbd.sock"),
		"--control", filepath.Join(sockDir, "control.sock")}, tlsFlags(other)...), specs...)...)
	if err == nil || !strings.Contains(out, "TLS handshake failed") || !strings.Contains(out, specs[0]) {
		t.Fatalf("serve with the wrong CA: %v\n%s\nwant the TLS error naming %s", err, out, specs[0])
	}
}
