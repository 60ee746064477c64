package test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The lab: several hosts on one machine for the tests of members on other hosts
// (e2e_netns_test.go). Each host is a network namespace (ip netns) with its own addresses and
// loopback; the raid5d host, the hub, has a veth pair to every other host, in a private range
// (labNet). Processes run on a host through `ip netns exec`, which execs them (the PID is the
// process's), so they are stopped by PID as the other tests' processes are; the test process
// itself stays where it is and reaches a host's addresses by dialing from a thread that has
// joined the host's namespace (netHost.dial). Unix sockets (raid5d's control socket, nbdkit's
// pause control) are paths, which every namespace shares.

// labNet is the private range of every lab's links: host i's link to the hub is labNet.i.0/24,
// the hub .1 and the host .2 on it. Each lab has its own namespaces, so labs running at once (in
// parallel tests or test binaries) use the same addresses without meeting.
const labNet = "10.157"

// labPort is the TCP port of every server in a lab (raid5d and the member servers).
const labPort = "10809"

// netnsDir is where ip netns keeps its named namespaces.
const netnsDir = "/run/netns"

// labPrefix starts the names of every lab's namespaces: labPrefix-PID-SEQ-HOST, so that a lab
// left behind by a test binary that died (a panic, a -timeout) is recognised and removed by the
// next (sweepLabs), and labs of one binary never share a name.
const labPrefix = "r5n"

var labSeq atomic.Int32

// lab is a set of hosts made of network namespaces for one test: the hub (the raid5d host) and
// hosts joined to it each by its own veth pair. Its cleanup, registered before anything runs
// on it, SIGKILLs every process still in its namespaces (by PID, from ip netns pids) and
// deletes the namespaces by name, which deletes their veths.
type lab struct {
	t     testing.TB
	id    string // labPrefix-PID-SEQ: the start of its namespaces' names
	short string // a few hex digits unique per lab of this binary: in its veths' names
	hub   *netHost
	hosts []*netHost // besides the hub, in the order made: hosts[i] is on labNet.(i+1)
}

// netHost is one host of a lab.
type netHost struct {
	lab    *lab
	name   string // the test's name for it: raid, m0, client...
	ns     string // its network namespace
	ip     string // its address on its link to the hub ("" for the hub)
	hubIP  string // the hub's address on that link
	dev    string // its end of the veth pair
	hubDev string // the hub's end
}

// newLab makes a lab with its hub, or skips the test (fails it under RAID5D_REQUIRE_TOOLS=1)
// where network namespaces cannot be made.
func newLab(t testing.TB) *lab {
	t.Helper()
	need(t, "ip")
	sweepLabs(t)
	seq := labSeq.Add(1)
	pid := os.Getpid()
	l := &lab{t: t, id: fmt.Sprintf("%s-%d-%d", labPrefix, pid, seq), short: fmt.Sprintf("%05x", (pid<<6|int(seq))&0xfffff)}
	l.hub = &netHost{lab: l, name: "raid", ns: l.id + "-raid"}
	if out, err := runToolErr("ip", "netns", "add", l.hub.ns); err != nil {
		skipOrFail(t, "network namespaces not permitted here (ip netns add needs root or CAP_SYS_ADMIN): %v\n%s", err, out)
	}
	t.Cleanup(l.destroy)
	if out, err := runToolErr("ip", "netns", "exec", l.hub.ns, "true"); err != nil {
		t.Fatalf("ip netns exec: %v\n%s", err, out)
	}
	l.ip(t, "-n", l.hub.ns, "link", "set", "lo", "up")
	return l
}

// ip runs ip(8) with args, failing the test on an error.
func (l *lab) ip(t testing.TB, args ...string) {
	t.Helper()
	runTool(t, "ip", args...)
}

// host adds a host named name, joined to the hub by a veth pair on the next free link.
func (l *lab) host(t testing.TB, name string) *netHost {
	t.Helper()
	k := len(l.hosts) + 1
	h := &netHost{lab: l, name: name, ns: l.id + "-" + name,
		ip: fmt.Sprintf("%s.%d.2", labNet, k), hubIP: fmt.Sprintf("%s.%d.1", labNet, k),
		dev: fmt.Sprintf("v%su%d", l.short, k), hubDev: fmt.Sprintf("v%sh%d", l.short, k)}
	hubDev := h.hubDev
	l.ip(t, "netns", "add", h.ns)
	l.hosts = append(l.hosts, h) // destroy deletes it from here on
	l.ip(t, "-n", h.ns, "link", "set", "lo", "up")
	// Both ends are made in their namespaces: the pair never appears in this one.
	l.ip(t, "link", "add", hubDev, "netns", l.hub.ns, "type", "veth", "peer", "name", h.dev, "netns", h.ns)
	l.ip(t, "-n", l.hub.ns, "addr", "add", h.hubIP+"/24", "dev", hubDev)
	l.ip(t, "-n", h.ns, "addr", "add", h.ip+"/24", "dev", h.dev)
	l.ip(t, "-n", l.hub.ns, "link", "set", hubDev, "up")
	l.ip(t, "-n", h.ns, "link", "set", h.dev, "up")
	return h
}

// destroy stops what still runs on the lab's hosts and deletes their namespaces.
func (l *lab) destroy() {
	for i := len(l.hosts) - 1; i >= 0; i-- {
		if err := destroyNetns(l.hosts[i].ns); err != nil {
			l.t.Errorf("lab cleanup: %v", err)
		}
	}
	if err := destroyNetns(l.hub.ns); err != nil {
		l.t.Errorf("lab cleanup: %v", err)
	}
}

// destroyNetns SIGKILLs every process in the namespace ns by PID, waits for them to be gone,
// and deletes ns (with its veths).
func destroyNetns(ns string) error {
	deadline := time.Now().Add(stopGrace)
	for {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			break // already gone, or never made
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s: processes %v still there %v after SIGKILL", ns, pids, stopGrace)
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, ns)); err != nil {
		return nil
	}
	if out, err := runToolErr("ip", "netns", "del", ns); err != nil {
		return fmt.Errorf("ip netns del %s: %v\n%s", ns, err, out)
	}
	return nil
}

// sweepLabs deletes the namespaces of labs whose test binary is no longer running (one that was
// killed before its cleanups ran), with what still runs in them.
func sweepLabs(t testing.TB) {
	t.Helper()
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		f := strings.Split(e.Name(), "-")
		if len(f) < 4 || f[0] != labPrefix {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if err := destroyNetns(e.Name()); err != nil {
			t.Logf("a dead run's lab: %v", err)
		}
	}
}

// prefix is the command prefix that runs a command on h; nil (here) for a nil host.
func (h *netHost) prefix() []string {
	if h == nil {
		return nil
	}
	return []string{"ip", "netns", "exec", h.ns}
}

// netPrefix is the command prefix that runs a command in h's network namespace only, in this
// mount namespace (ip netns exec makes a mount namespace of its own): for nbdfuse, whose FUSE
// mount the test uses. Nil (here) for a nil host.
func (h *netHost) netPrefix() []string {
	if h == nil {
		return nil
	}
	return []string{"nsenter", "--net=" + filepath.Join(netnsDir, h.ns)}
}

// cut takes h off the network: its end of the veth pair goes down, so that packets to and from
// it are dropped and nothing tells its peers (no reset, no close), as when a host loses power
// or its cable.
func (h *netHost) cut(t testing.TB) {
	t.Helper()
	h.lab.ip(t, "-n", h.ns, "link", "set", h.dev, "down")
}

// restore brings h back on the network after cut: the same address, its processes as they were.
// The hub forgets what it learnt of h's link-layer address while h was away (a failed
// resolution makes the next connect fail with EHOSTUNREACH until it is probed again), as
// a host that reboots announces itself.
func (h *netHost) restore(t testing.TB) {
	t.Helper()
	h.lab.ip(t, "-n", h.ns, "link", "set", h.dev, "up")
	h.lab.ip(t, "-n", h.lab.hub.ns, "neigh", "flush", "dev", h.hubDev)
}

// dial connects to addr from inside h's namespace: a socket made on a thread that has joined
// it stays in it. (Unix sockets are paths, the same from every namespace.)
func (h *netHost) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer self.Close()
		target, err := os.Open(filepath.Join(netnsDir, h.ns))
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("setns %s: %w", h.ns, err)}
			return
		}
		c, err := net.DialTimeout(network, addr, timeout)
		// Back home before the thread serves other goroutines; a thread that cannot go back
		// stays locked and ends with this goroutine.
		if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- result{c, err}
	}()
	r := <-done
	return r.c, r.err
}

// canDial reports whether addr accepts a connection from h.
func (h *netHost) canDial(network, addr string) bool {
	c, err := h.dial(network, addr, 5*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// memberHost adds a host named name serving a new member file of memberSize bytes as
// nbd://IP:labPort/NAME: with nbd-server if nbdServer, else with nbdkit's file plugin and extra
// (filters and keys, as remoteMember.start takes them).
func (l *lab) memberHost(t *testing.T, name string, nbdServer bool, extra ...string) *remoteMember {
	t.Helper()
	h := l.host(t, name)
	m := &remoteMember{file: filepath.Join(t.TempDir(), name+".img"), host: h, nbdServer: nbdServer,
		addr: net.JoinHostPort(h.ip, labPort)}
	m.uri = fmt.Sprintf("nbd://%s/%s", m.addr, name)
	if err := os.WriteFile(m.file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(m.file, memberSize); err != nil {
		t.Fatal(err)
	}
	m.start(t, extra...)
	return m
}

// serve starts raid5d serve on the hub with members and flags, listening on the hub's address on
// client's link, and waits until it greets a client there. The server's uri is for clients on
// client; its control socket is a path, so the management commands run here.
func (l *lab) serve(t testing.TB, client *netHost, members []string, flags ...string) *server {
	t.Helper()
	s, greet := l.startServe(t, client, members, flags...)
	s.awaitGreeting(greet)
	return s
}

// startServe is serve without the wait: it returns the server started and the probe that
// awaitGreeting takes.
func (l *lab) startServe(t testing.TB, client *netHost, members []string, flags ...string) (*server, func() (*wireClient, error)) {
	t.Helper()
	ctlDir, err := os.MkdirTemp("", "r5d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ctlDir) })
	addr := net.JoinHostPort(client.hubIP, labPort)
	s := &server{t: t, uri: "nbd://" + addr + "/", control: filepath.Join(ctlDir, "control.sock")}
	args := append([]string{"serve", "--listen", addr, "--control", s.control, "--log-format", "json"}, flags...)
	s.proc = startProcIn(t, l.hub.prefix(), raid5dBin, append(args, members...)...)
	t.Cleanup(func() { s.stop() })
	return s, func() (*wireClient, error) {
		conn, err := client.dial("tcp", addr, wireTimeout)
		if err != nil {
			return nil, err
		}
		return wireGreet(conn)
	}
}

// netArray is an array of memberCount members on hosts of their own in a lab (nbdkit on the
// first three, nbd-server on the last), made by raid5d create on the hub, and a client host.
type netArray struct {
	lab     *lab
	members []*remoteMember
	client  *netHost
	uris    []string
}

// newNetArray makes the lab, the member hosts and the array. filters[i] are extra nbdkit
// options and keys for member i (one of the first three).
func newNetArray(t *testing.T, filters map[int][]string) *netArray {
	t.Helper()
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	n := &netArray{lab: newLab(t)}
	for i := range memberCount {
		m := n.lab.memberHost(t, fmt.Sprintf("m%d", i), i == memberCount-1, filters[i]...)
		n.members = append(n.members, m)
		n.uris = append(n.uris, m.uri)
	}
	n.client = n.lab.host(t, "client")
	// a write-intent region per stripe, so that re-adds and resyncs show which stripes they took
	runToolIn(t, n.lab.hub.prefix(), raid5dBin, append([]string{"create", "--chunk", "64K", "--bitmap-region", fmt.Sprint(stripeData)}, n.uris...)...)
	return n
}

// serve serves the array from the hub to the client host.
func (n *netArray) serve(t *testing.T, flags ...string) *server {
	t.Helper()
	return n.lab.serve(t, n.client, n.uris, flags...)
}

// serveWithout serves the array without member i (degraded), with flags.
func (n *netArray) serveWithout(t *testing.T, i int, flags ...string) *server {
	t.Helper()
	rest := append(append([]string{}, n.uris[:i]...), n.uris[i+1:]...)
	return n.lab.serve(t, n.client, rest, flags...)
}

// files is the array's member files, as the member hosts hold them (for checkParity, with the
// servers idle).
func (n *netArray) files() *array {
	a := &array{}
	for _, m := range n.members {
		a.members = append(a.members, m.file)
	}
	return a
}

// fio runs the job file test/fio/<job> on the client host against s.
func (n *netArray) fio(t *testing.T, s *server, job string, extra ...string) []fioJob {
	t.Helper()
	return runFioIn(t, n.client.prefix(), s.uri, job, extra...)
}
