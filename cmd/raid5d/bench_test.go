package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/loadgen"
	"github.com/raid5d/raid5d/internal/testpki"
	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid"
)

// serveBench serves dev over a unix socket for the test's lifetime and returns its URI.
func serveBench(t *testing.T, dev nbd.Device) string {
	t.Helper()
	srv, err := nbd.NewServer(nbd.Options{
		Exports: []nbd.Export{{Name: "x", Device: dev}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return "nbd+unix:///x?socket=" + nbdtest.ServeUnix(t, srv)
}

// TestBenchVerifyAndCheck runs bench writing with a verify log, checks the device against it,
// then spoils one block the log says is durable and checks again: exit 1, the offset named.
func TestBenchVerifyAndCheck(t *testing.T) {
	dev := nbdtest.FUADevice{MemDevice: nbdtest.NewMemDevice(4 << 20)}
	uri := serveBench(t, dev)
	vlog := filepath.Join(t.TempDir(), "vlog")
	code, out, errOut := runCLI(t, "bench", uri, "--rw", "randwrite", "--time", "0", "--iodepth", "8", "--jobs", "2",
		"--verify", "--flush-every", "16", "--verify-log", vlog, "--seed", "7")
	if code != 0 || !strings.Contains(out, "; 0 mismatches") || !strings.Contains(out, "write lat (µs): p50") {
		t.Fatalf("bench: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "bench", uri, "--check", vlog)
	if code != 0 || !strings.Contains(out, "violations 0") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}

	f, err := os.Open(vlog)
	if err != nil {
		t.Fatal(err)
	}
	st, err := loadgen.ReadLog(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	victim := int64(-1)
	for b, d := range st.Durable {
		if d > 0 {
			victim = int64(b) * 4096
			break
		}
	}
	if victim < 0 {
		t.Fatal("no durable block in the log")
	}
	dev.WriteAt(make([]byte, 4096), victim)
	code, out, _ = runCLI(t, "bench", uri, "--check", vlog, "--json")
	var res loadgen.CheckResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if code != 1 || res.Violations != 1 || len(res.First) != 1 || res.First[0].Offset != victim || res.First[0].Found != "zeroes" {
		t.Fatalf("check after zeroing block at %d: exit %d, %+v", victim, code, res)
	}
}

func TestBenchJSONAndErrors(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	uri := serveBench(t, dev)
	code, out, errOut := runCLI(t, "bench", uri, "--rw", "write", "--bs", "64K", "--time", "0", "--json")
	var res loadgen.Result
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil {
		t.Fatalf("exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if res.WriteBytes != 1<<20 || res.WriteIOs != 16 || res.Lat.Count != 16 || res.Mode != "write" {
		t.Errorf("one pass of 64K writes over 1M: %+v", res)
	}
	for _, tc := range []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"bench"}, 2, "want exactly one URI"},
		{[]string{"bench", "http://x"}, 2, "bad NBD URI"},
		{[]string{"bench", uri, "--rw", "sideways"}, 2, "unknown mode"},
		{[]string{"bench", uri, "--bs", "1000"}, 2, "block size 1000"},
		{[]string{"bench", uri, "--bs", "64M"}, 2, "at most 32M"},
		{[]string{"bench", uri, "--rw", "randwrite", "--verify", "--size", "64K"}, 2, "must outnumber"},
		{[]string{"bench", uri, "--check", "/nonexistent/vlog"}, 1, "no such file"},
		{[]string{"bench", "--help"}, 0, "-verify-log file"},
	} {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.contains) {
				t.Errorf("exit %d (want %d), output lacks %q:\n%s%s", code, tc.code, tc.contains, out, errOut)
			}
		})
	}
}

// TestBenchRaidArray drives a real raid5d array (assembled in process, as serve does) with
// verified random writes and mixed I/O, then checks it against the verify log.
func TestBenchRaidArray(t *testing.T) {
	dir := t.TempDir()
	var members []string
	for i := range 3 {
		members = append(members, filepath.Join(dir, "m"+string(rune('0'+i))))
	}
	if code, out, errOut := runCLI(t, append([]string{"create", "--size", "8M"}, members...)...); code != 0 {
		t.Fatalf("create: %s%s", out, errOut)
	}
	a, err := raid.Assemble(members, raid.AssembleOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	uri := serveBench(t, a)
	vlog := filepath.Join(dir, "vlog")
	for _, rw := range []string{"randwrite", "rw"} {
		code, out, errOut := runCLI(t, "bench", uri, "--rw", rw, "--time", "0", "--iodepth", "16",
			"--verify", "--flush-every", "32", "--verify-log", vlog)
		if code != 0 || !strings.Contains(out, "; 0 mismatches") {
			t.Fatalf("bench %s: exit %d\n%s%s", rw, code, out, errOut)
		}
		code, out, errOut = runCLI(t, "bench", uri, "--check", vlog)
		if code != 0 || !strings.Contains(out, "violations 0") {
			t.Fatalf("check after %s: exit %d\n%s%s", rw, code, out, errOut)
		}
	}
}

// TestBenchNbdkit runs bench and check against nbdkit's memory plugin. Skipped without nbdkit
// unless RAID5D_REQUIRE_TOOLS=1.
func TestBenchNbdkit(t *testing.T) {
	if _, err := exec.LookPath("nbdkit"); err != nil {
		if os.Getenv("RAID5D_REQUIRE_TOOLS") == "1" {
			t.Fatalf("nbdkit is required (RAID5D_REQUIRE_TOOLS=1): %v", err)
		}
		t.Skip("nbdkit not installed")
	}
	dir := t.TempDir()
	sock, pidfile := filepath.Join(dir, "s.sock"), filepath.Join(dir, "pid")
	cmd := exec.Command("nbdkit", "--foreground", "--unix", sock, "--pidfile", pidfile, "memory", "16M")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(pidfile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nbdkit did not start")
		}
	}
	uri := "nbd+unix:///?socket=" + sock
	vlog := filepath.Join(dir, "vlog")
	code, out, errOut := runCLI(t, "bench", uri, "--rw", "randwrite", "--time", "0", "--jobs", "2",
		"--verify", "--fua", "--verify-log", vlog)
	if code != 0 || !strings.Contains(out, "; 0 mismatches") {
		t.Fatalf("bench: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "bench", uri, "--check", vlog)
	if code != 0 || !strings.Contains(out, "violations 0") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
}

// TestBenchTLS: bench reaches a TLS-only server through an nbds+unix URI with --tls-ca and
// verifies what it wrote; a plaintext URI gets the error that says what to do; TLS flags with
// a plaintext URI are a usage error.
func TestBenchTLS(t *testing.T) {
	pki := testpki.New(t)
	conf, err := nbd.LoadTLSConfig(pki.Path(testpki.ServerCert), pki.Path(testpki.ServerKey), "")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nbd.NewServer(nbd.Options{
		TLSConfig: conf, TLSMode: nbd.TLSRequire,
		Exports: []nbd.Export{{Name: "x", Device: nbdtest.NewMemDevice(4 << 20)}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := nbdtest.ServeUnix(t, srv)

	code, out, errOut := runCLI(t, "bench", "nbds+unix:///x?socket="+sock, "--tls-ca", pki.Path(testpki.CACert),
		"--rw", "randwrite", "--time", "0", "--verify", "--iodepth", "4")
	if code != 0 || !strings.Contains(out, "; 0 mismatches") {
		t.Fatalf("bench over TLS: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "bench", "nbd+unix:///x?socket="+sock, "--time", "0")
	if code != 1 || !strings.Contains(errOut, "server requires TLS; use nbds://") {
		t.Errorf("plaintext bench against a TLS-only server: exit %d, want 1 and the hint\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "bench", "nbd+unix:///x?socket="+sock, "--tls-ca", pki.Path(testpki.CACert))
	if code != 2 || !strings.Contains(errOut, "need an nbds://") {
		t.Errorf("--tls-ca with a plaintext URI: exit %d, want 2\n%s%s", code, out, errOut)
	}
}
