package test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The geometry every end-to-end array uses: small enough for two cores, big enough for several
// block groups of ext4 and a few MiB of fio traffic per job.
const (
	memberCount = 4
	memberSize  = 64 << 20 // bytes per member file, created sparse by raid5d create --size
	chunkSize   = 64 << 10
	// dataOffset is where array data starts on each member (superblock and metadata before it).
	dataOffset = 1 << 20
	stripeData = (memberCount - 1) * chunkSize // data bytes in one full stripe (192 KiB)
	arraySize  = (memberCount - 1) * (memberSize - dataOffset)
)

// How long a server gets to start accepting, and to exit after SIGTERM.
const (
	startTimeout = 30 * time.Second
	stopGrace    = 30 * time.Second
)

// array is a set of member files in a test's temporary directory.
type array struct {
	dir     string
	members []string
}

// newArray creates a fresh array of memberCount sparse members of memberSize bytes with
// raid5d create. In stand-in mode it creates one sparse file of arraySize bytes for nbdkit.
func newArray(t testing.TB) *array { t.Helper(); return newArrayWith(t) }

// newArrayWith is newArray with extra raid5d create flags (ignored by the nbdkit stand-in).
func newArrayWith(t testing.TB, createFlags ...string) *array {
	t.Helper()
	a := &array{dir: t.TempDir()}
	for i := range memberCount {
		a.members = append(a.members, filepath.Join(a.dir, fmt.Sprintf("member%d.img", i)))
	}
	if standin {
		// Empty stand-ins for the members, so tests can delete one as they would a real member.
		for _, m := range a.members {
			if err := os.WriteFile(m, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.Create(a.standinImage())
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(arraySize); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return a
	}
	args := append([]string{"create", "--chunk", "64K", "--layout", "left-symmetric", "--size", "64M"}, createFlags...)
	runTool(t, raid5dBin, append(args, a.members...)...)
	for _, m := range a.members {
		fi, err := os.Stat(m)
		if err != nil {
			t.Fatalf("after raid5d create: %v", err)
		}
		if fi.Size() != memberSize {
			t.Fatalf("after raid5d create --size 64M: %s is %d bytes, want %d", m, fi.Size(), memberSize)
		}
	}
	return a
}

// standinImage is the file nbdkit serves in stand-in mode.
func (a *array) standinImage() string { return filepath.Join(a.dir, "standin.img") }

// server is a running raid5d serve (or the nbdkit stand-in) on a unix socket.
type server struct {
	*proc
	t    testing.TB
	sock string
	uri  string // nbd+unix:///?socket=...
	// control is raid5d's control socket, for the management commands (--control); one per
	// server, so no test meets another's daemon, or a daemon at the default socket.
	control string

	stopped bool // stop was called; only the test goroutine touches it
}

// serve starts raid5d serve on a fresh unix socket with extra flags (say --read-only), logging
// JSON to a buffer shown if the test fails, and waits until the server greets a client. A
// cleanup stops it with SIGTERM and fails the test unless it exits 0 in time.
func (a *array) serve(t testing.TB, flags ...string) *server {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir paths grow with the test name.
	sockDir, err := os.MkdirTemp("", "r5d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	s := &server{t: t, sock: filepath.Join(sockDir, "nbd.sock"), control: filepath.Join(sockDir, "control.sock")}
	s.uri = "nbd+unix:///?socket=" + s.sock

	if standin {
		need(t, "nbdkit")
		args := []string{"--foreground", "--unix", s.sock}
		for _, f := range flags {
			switch f {
			case "--read-only":
				args = append(args, "--readonly")
			default:
				t.Fatalf("stand-in: no nbdkit equivalent for serve flag %q", f)
			}
		}
		args = append(args, "--filter=blocksize-policy", "file", "file="+a.standinImage(),
			"blocksize-minimum=512", "blocksize-preferred=4096", "blocksize-maximum=32M")
		s.proc = startProc(t, "nbdkit", args...)
	} else {
		args := []string{"serve", "--socket", s.sock, "--control", s.control, "--log-format", "json"}
		args = append(args, flags...)
		s.proc = startProc(t, raid5dBin, append(args, a.members...)...)
	}
	t.Cleanup(func() { s.stop() })
	s.awaitGreeting(func() (*wireClient, error) { return wireDial(s.sock) })
	return s
}

// awaitGreeting waits until the server greets a client that dial connects: it is ready. The
// probe then aborts politely, so the server has no reason to log a failed handshake.
func (s *server) awaitGreeting(dial func() (*wireClient, error)) {
	s.t.Helper()
	waitFor(s.t, "the server to greet a client", startTimeout, s.proc, func() bool {
		c, err := dial()
		if err != nil {
			return false
		}
		if err := c.abort(); err != nil {
			s.t.Logf("readiness probe: NBD_OPT_ABORT: %v", err)
		}
		return true
	})
}

// stop sends SIGTERM and fails the test unless the server exits with status 0 within stopGrace
// (after which it is killed), or if it had already died on its own. Calling it again is harmless.
func (s *server) stop() {
	s.t.Helper()
	if s.stopped {
		return
	}
	s.stopped = true
	if !s.running() {
		s.t.Errorf("server exited before it was stopped: %v", s.err)
		return
	}
	killed, err := s.proc.stop(syscall.SIGTERM, stopGrace)
	switch {
	case killed:
		s.t.Errorf("server did not exit within %v of SIGTERM; killed", stopGrace)
	case err != nil:
		s.t.Errorf("server after SIGTERM: %v (want exit status 0)", err)
	}
}
