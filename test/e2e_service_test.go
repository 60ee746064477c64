package test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Running raid5d as a service: the configuration file, sd_notify readiness and shutdown, and
// the systemd unit in dist/.

// offlineStatus is `raid5d status --json` read from the members' superblocks: the control
// socket named is one nothing listens on, so no daemon answers.
func offlineStatus(t *testing.T, a *array) (state string, dirty bool) {
	t.Helper()
	args := append([]string{"status", "--json", "--control", filepath.Join(a.dir, "nobody.sock")}, a.members...)
	out, err := runToolErr(raid5dBin, args...)
	var st struct {
		Source string `json:"source"`
		State  string `json:"state"`
		Dirty  bool   `json:"dirty"`
	}
	if jerr := json.Unmarshal([]byte(out), &st); jerr != nil || st.Source != "offline" {
		t.Fatalf("raid5d status --json offline: %v %v\n%s", err, jerr, out)
	}
	return st.State, st.Dirty
}

// TestServiceNotify starts raid5d serve from a configuration file (relative member paths) with
// NOTIFY_SOCKET pointing at a socket the test listens on, as systemd would. READY=1 comes after
// a STATUS while assembling, and once it has come the export answers nbdinfo at once (no
// retry); its STATUS names the export, the socket and the state. After writes the superblocks
// say dirty; SIGTERM brings STOPPING=1, exit 0, and superblocks that say clean.
func TestServiceNotify(t *testing.T) {
	need(t, "nbdinfo")
	needRaid5d(t)
	a := newArray(t)
	sockDir, err := os.MkdirTemp("", "r5n")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "nbd.sock")
	notifyPath := filepath.Join(sockDir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	cfg := filepath.Join(a.dir, "array.toml")
	var members []string
	for _, m := range a.members {
		members = append(members, strconv.Quote(filepath.Base(m)))
	}
	if err := os.WriteFile(cfg, []byte(`# written by TestServiceNotify
members = [`+strings.Join(members, ", ")+`]
socket = "`+sock+`"
control = "`+filepath.Join(sockDir, "control.sock")+`"
log-format = "json"
stable-pages = false
`), 0o644); err != nil {
		t.Fatal(err)
	}

	var out lockedBuffer
	cmd := exec.Command(raid5dBin, "serve", "--config", cfg)
	cmd.Dir = t.TempDir() // relative members resolve against the file, not the working directory
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notifyPath)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("raid5d serve output:\n%s", out.String())
		}
	}()

	next := notifyReader(t, notify)
	var msgs []string
	for {
		m := next("READY=1")
		msgs = append(msgs, m)
		if strings.Contains(m, "READY=1\n") {
			break
		}
	}
	// The export answers now, on the first try.
	if got, err := runToolErr("nbdinfo", "--size", "nbd+unix:///?socket="+sock); err != nil || strings.TrimSpace(got) != strconv.Itoa(arraySize) {
		t.Fatalf("nbdinfo right after READY=1: %v %q", err, got)
	}
	if len(msgs) < 2 || !strings.HasPrefix(msgs[0], "STATUS=assembling the array from 4 members") {
		t.Errorf("messages before READY: %q, want a STATUS while assembling first", msgs)
	}
	if want := "STATUS=serving raid5d on " + sock + ", state clean\n"; !strings.Contains(msgs[len(msgs)-1], want) {
		t.Errorf("READY message %q lacks %q", msgs[len(msgs)-1], want)
	}

	// Write, so the superblocks say dirty until a clean shutdown.
	runTool(t, raid5dBin, "bench", "nbd+unix:///?socket="+sock, "--rw", "write", "--size", "1M", "--time", "0", "--verify")
	if state, dirty := offlineStatus(t, a); !dirty {
		t.Fatalf("superblocks while serving after writes: state %s, dirty %v; want dirty (else the clean check below proves nothing)", state, dirty)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		m := next("STOPPING=1")
		if strings.HasPrefix(m, "STOPPING=1\n") {
			break
		}
		if strings.Contains(m, "READY=1") {
			t.Errorf("READY=1 again: %q", m)
		}
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred check
		if err != nil {
			t.Fatalf("raid5d serve after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(stopGrace):
		t.Fatalf("raid5d serve still running %v after SIGTERM", stopGrace)
	}
	if state, dirty := offlineStatus(t, a); state != "clean" || dirty {
		t.Errorf("superblocks after SIGTERM: state %s, dirty %v; want clean", state, dirty)
	}
}

// TestSystemdUnit checks dist/raid5d@.service with systemd-analyze verify (skipped without it),
// with ExecStart pointing at the binary under test, and that the example configuration is
// accepted by that binary.
func TestSystemdUnit(t *testing.T) {
	needRaid5d(t)
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("no systemd-analyze")
	}
	unit, err := os.ReadFile("../dist/raid5d@.service")
	if err != nil {
		t.Fatal(err)
	}
	text := string(unit)
	for _, want := range []string{
		"Type=notify", "ExecStart=/usr/local/bin/raid5d serve --config /etc/raid5d/%i.toml --export %i --control /run/raid5d/%i.sock",
		"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "RuntimeDirectory=raid5d",
		"LimitMEMLOCK=", "Restart=on-failure", "TimeoutStopSec=",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the unit lacks %q", want)
		}
	}
	dir := t.TempDir()
	text = strings.ReplaceAll(text, "/usr/local/bin/raid5d", raid5dBin)
	if err := os.WriteFile(filepath.Join(dir, "raid5d@.service"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	inst := filepath.Join(dir, "raid5d@array0.service")
	if err := os.Symlink("raid5d@.service", inst); err != nil {
		t.Fatal(err)
	}
	out, err := runToolErr("systemd-analyze", "verify", "--man=no", inst)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	runTool(t, raid5dBin, "serve", "--config", "../dist/raid5d.example.toml", "--print-config")
}

// notifyReader returns a function that reads the next datagram from the service-manager socket
// notify, failing the test (naming what was awaited) if none comes within startTimeout.
func notifyReader(t *testing.T, notify *net.UnixConn) func(what string) string {
	buf := make([]byte, 4096)
	return func(what string) string {
		t.Helper()
		notify.SetReadDeadline(time.Now().Add(startTimeout))
		n, err := notify.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s on NOTIFY_SOCKET: %v", what, err)
		}
		return string(buf[:n])
	}
}

// TestServiceNotifyWaiting: while serve waits for a remote member whose server is not up yet
// (a member host booting after the daemon's), the service manager's STATUS line says so and
// names it; once its server starts, the array assembles whole and READY=1 follows.
func TestServiceNotifyWaiting(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, uris(ms)...)...)
	late := ms[0]
	late.p.stop(syscall.SIGTERM, stopGrace)
	sockDir, err := os.MkdirTemp("", "r5w")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	notifyPath := filepath.Join(sockDir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	sock, ctl := filepath.Join(sockDir, "nbd.sock"), filepath.Join(sockDir, "control.sock")
	p := startProcEnv(t, []string{"NOTIFY_SOCKET=" + notifyPath}, raid5dBin, append([]string{"serve",
		"--socket", sock, "--control", ctl, "--assemble-timeout", "2m"}, uris(ms)...)...)
	defer p.stop(syscall.SIGTERM, stopGrace)

	next := notifyReader(t, notify)
	want := "STATUS=assembling the array from 4 members: waiting up to 2m0s for 1 remote member that does not answer yet: " + late.uri + "\n"
	var msgs []string
	for m := ""; m != want; {
		if m = next("the STATUS line of the wait"); strings.Contains(m, "READY=1") {
			t.Fatalf("READY=1 with a member's server down: %q after %q", m, msgs)
		}
		msgs = append(msgs, m)
	}
	late.start(t)
	for m := ""; !strings.Contains(m, "READY=1\n"); {
		m = next("READY=1 after the member's server started")
		msgs = append(msgs, m)
	}
	// The wait's end is told before READY: the line goes back to plain assembling.
	if !slices.Contains(msgs[slices.Index(msgs, want)+1:], "STATUS=assembling the array from 4 members\n") {
		t.Errorf("messages %q: no plain assembling STATUS after the wait's", msgs)
	}
	s := &server{proc: p, t: t, sock: sock, control: ctl, stopped: true} // stopped by the defer above
	if st := s.status(); !st.healthy() {
		t.Fatalf("assembled with the late member's server started: %+v, want every member active", st)
	}
}
