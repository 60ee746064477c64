package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Live management through the control socket: raid5d status/fail/remove/add/replace/scrub/rebuild
// against a running daemon, under fio load.

// r5Status is the part of `raid5d status --json` the tests read (the documented JSON).
type r5Status struct {
	Source    string `json:"source"`
	State     string `json:"state"`
	WriteHole bool   `json:"write_hole"`
	Events    uint64 `json:"events"`
	Members   []struct {
		Path        string `json:"path"`
		Role        int    `json:"role"`
		State       string `json:"state"`
		ReadErrors  uint64 `json:"read_errors"`
		WriteErrors uint64 `json:"write_errors"`
	} `json:"members"`
	Missing      []int       `json:"missing"`
	Sync         *r5Progress `json:"sync"`
	LastScrub    *r5Progress `json:"last_scrub"`
	LastRebuild  *r5Rebuild  `json:"last_rebuild"`
	SyncSpeedMin int64       `json:"sync_speed_min"`
	SyncSpeedMax int64       `json:"sync_speed_max"`
}

type r5Progress struct {
	Kind       string  `json:"kind"`
	Role       int     `json:"role"`
	Done       int64   `json:"done"`
	Total      int64   `json:"total"`
	Mismatches int64   `json:"mismatches"`
	MismatchAt []int64 `json:"mismatch_at"`
	Resumed    int64   `json:"resumed"`
	Resynced   int64   `json:"resynced"`
}

// r5Rebuild is status's last_rebuild: the last rebuild or re-add that ended.
type r5Rebuild struct {
	Role     int    `json:"role"`
	ReAdd    bool   `json:"re_add"`
	Resumed  int64  `json:"resumed"`
	Resynced int64  `json:"resynced"`
	Total    int64  `json:"total"`
	Err      string `json:"error"`
}

// member returns the state and role of the member at path, or "" if the array does not list it.
func (st *r5Status) member(path string) (state string, role int, readErrors uint64) {
	for _, m := range st.Members {
		if m.Path == path {
			return m.State, m.Role, m.ReadErrors
		}
	}
	return "", -1, 0
}

// healthy reports whether every role has an active member and nothing is being rebuilt.
func (st *r5Status) healthy() bool {
	return len(st.Missing) == 0 && (st.Sync == nil || st.Sync.Kind != "rebuild") && st.State != "degraded" && st.State != "failed"
}

// manage runs a raid5d management command against the server's control socket and returns
// its output (stdout then stderr) and exit status; it fails the test only if raid5d could not run.
func (s *server) manage(args ...string) (string, int) {
	s.t.Helper()
	stdout, stderr, code := s.manageSplit(args...)
	return stdout + stderr, code
}

// manageSplit is manage with stdout and stderr apart.
func (s *server) manageSplit(args ...string) (stdout, stderr string, code int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, raid5dBin, append(args, "--control", s.control)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		s.t.Fatalf("raid5d %s: %v\n%s%s", strings.Join(args, " "), err, o.Bytes(), e.Bytes())
	}
	return o.String(), e.String(), code
}

// mustManage is manage that fails the test unless raid5d exits 0.
func (s *server) mustManage(args ...string) string {
	s.t.Helper()
	out, code := s.manage(args...)
	if code != 0 {
		s.t.Fatalf("raid5d %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// status is `raid5d status --json` from the running daemon.
func (s *server) status() *r5Status {
	s.t.Helper()
	out, errOut, code := s.manageSplit("status", "--json")
	if code != 0 && code != 1 && code != 3 { // 1: failed array (or an error: then no JSON)
		s.t.Fatalf("raid5d status --json: exit %d\n%s%s", code, out, errOut)
	}
	var st r5Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("raid5d status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	if st.Source != "online" {
		s.t.Fatalf("raid5d status --json: source %q, want online\n%s", st.Source, out)
	}
	return &st
}

// waitStatus polls the daemon's status until cond holds, failing the test after timeout.
func (s *server) waitStatus(what string, timeout time.Duration, cond func(*r5Status) bool) *r5Status {
	s.t.Helper()
	var st *r5Status
	waitFor(s.t, what, timeout, s.proc, func() bool {
		st = s.status()
		return cond(st)
	})
	return st
}

// kill SIGKILLs the daemon (a crash): no flush, no clean mark, the control socket left behind.
func (s *server) kill() {
	s.t.Helper()
	s.stopped = true
	if _, err := s.proc.stop(syscall.SIGKILL, stopGrace); err == nil {
		s.t.Fatal("daemon exited 0 after SIGKILL")
	}
}

// newSpare creates a sparse file of a member's size in the array's directory.
func (a *array) newSpare(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(a.dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(memberSize); err != nil {
		t.Fatal(err)
	}
	return p
}

// fioRun is fio running in the background; wait returns its jobs (checked like runFio's).
type fioRun struct {
	t       *testing.T
	done    chan struct{}
	err     error
	console bytes.Buffer
	report  string
	cancel  context.CancelFunc
}

// startFio runs fio like runFio, in the background.
func startFio(t *testing.T, uri, job string, extra ...string) *fioRun {
	t.Helper()
	return startFioIn(t, nil, uri, job, extra...)
}

// startFioIn is startFio with fio run under prefix (see prefixed): a client on a lab's host.
func startFioIn(t *testing.T, prefix []string, uri, job string, extra ...string) *fioRun {
	t.Helper()
	jobFile, err := filepath.Abs(filepath.Join("fio", job))
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	r := &fioRun{t: t, done: make(chan struct{}), report: filepath.Join(work, "fio.json")}
	args := append([]string{"--output-format=json", "--output=" + r.report}, extra...)
	args = append(args, jobFile)
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	r.cancel = cancel
	name, cmdArgs := prefixed(prefix, "fio", args...)
	cmd := exec.CommandContext(ctx, name, cmdArgs...)
	cmd.Env = append(os.Environ(), "NBD_URI="+uri)
	cmd.Dir = work
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdout = &r.console
	cmd.Stderr = &r.console
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func (r *fioRun) running() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

func (r *fioRun) wait() []fioJob {
	r.t.Helper()
	<-r.done
	r.cancel()
	report, _ := os.ReadFile(r.report)
	if r.err != nil {
		r.t.Fatalf("fio: %v\n%s\n%s", r.err, r.console.Bytes(), report)
	}
	var res struct {
		Jobs []fioJob `json:"jobs"`
	}
	i := bytes.IndexByte(report, '{')
	if i < 0 {
		r.t.Fatalf("fio wrote no JSON report\n%s", r.console.Bytes())
	}
	if err := json.NewDecoder(bytes.NewReader(report[i:])).Decode(&res); err != nil {
		r.t.Fatalf("fio JSON report: %v\n%s", err, report)
	}
	if len(res.Jobs) == 0 {
		r.t.Fatalf("fio reported no jobs\n%s", report)
	}
	for _, j := range res.Jobs {
		if j.Error != 0 {
			r.t.Errorf("fio job %s: error %d\n%s", j.Name, j.Error, r.console.Bytes())
		}
	}
	return res.Jobs
}

// withRole returns the array's members with the member of one role replaced by path (the spare
// that was rebuilt into it).
func (a *array) withRole(role int, path string) *array {
	b := &array{dir: a.dir, members: append([]string(nil), a.members...)}
	b.members[role] = path
	return b
}

// TestManageOnlineStatus: the basics of the control socket with the real daemon.
func TestManageOnlineStatus(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t)

	out, code := s.manage("status")
	if code != 0 || !strings.HasPrefix(out, "online: ") || !strings.Contains(out, "[4/4] [UUUU]") {
		t.Errorf("status of a healthy running array: exit %d\n%s", code, out)
	}
	st := s.status()
	if len(st.Members) != memberCount || !st.healthy() || st.Sync != nil {
		t.Errorf("status --json of a new array: %+v", st)
	}
	for r, m := range st.Members {
		if m.Path != a.members[r] || m.Role != r || m.State != "active" {
			t.Errorf("member %d: %+v, want %s active in role %d", r, m, a.members[r], r)
		}
	}

	// A second daemon for the same control socket is refused before it touches the members.
	out, err := runToolErr(raid5dBin, append([]string{"serve", "--socket", s.sock + "2", "--control", s.control}, a.members...)...)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "another daemon") {
		t.Errorf("second serve on the same control socket: %v\n%s", err, out)
	}
	if fi, err := os.Stat(s.control); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket after the refused second daemon: %v %v, want it there with permission 0600", fi, err)
	}
	if _, code := s.manage("status"); code != 0 {
		t.Errorf("the first daemon stopped answering: status exit %d", code)
	}

	// Refusals come back as errors with exit 1 and the daemon's reason.
	if out, code := s.manage("remove", "0"); code != 1 {
		t.Errorf("remove an active member: exit %d, want 1\n%s", code, out)
	}
	if out, code := s.manage("fail", filepath.Join(a.dir, "nonsense.img")); code != 1 {
		t.Errorf("fail a path that is no member: exit %d, want 1\n%s", code, out)
	}

	// After a crash the socket is stale: status says offline with MEMBERs, exit 2 without,
	// and a new daemon replaces the stale socket.
	s.kill()
	out, code = s.manage(append([]string{"status"}, a.members...)...)
	if !strings.HasPrefix(out, "offline: no daemon answers at "+s.control) {
		t.Errorf("status after the daemon died: exit %d\n%s", code, out)
	}
	if out, code := s.manage("fail", "1"); code != 4 || !strings.Contains(out, "--control") {
		t.Errorf("fail with no daemon: exit %d, want 4 and a hint about --control\n%s", code, out)
	}
	p := startProc(t, raid5dBin, append([]string{"serve", "--socket", s.sock, "--control", s.control}, a.members...)...)
	waitFor(t, "a new daemon on the stale control socket", startTimeout, p, func() bool {
		_, code := s.manage("status")
		return code == 0
	})
	if killed, err := p.stop(syscall.SIGTERM, stopGrace); killed || err != nil {
		t.Errorf("daemon on the stale socket after SIGTERM: killed %v, %v", killed, err)
	}
}

// TestFailAddRebuildUnderLoad: while fio writes and verifies through NBD, a member is failed
// with raid5d fail, the array keeps serving, a spare is added and rebuilt while fio keeps
// writing; then fio's verify reads back every byte, scrub check finds no mismatch, the member
// files' parity checks offline, and the data survives a restart on the rebuilt members.
func TestFailAddRebuildUnderLoad(t *testing.T) {
	need(t, "fio")
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t)
	// Writes at 2 MiB/s per job: about 8 s of writing, so everything below happens under it.
	run := startFio(t, s.uri, "verify.fio", "--rate=,2m")

	time.Sleep(1500 * time.Millisecond)
	s.mustManage("fail", a.members[2])
	st := s.status()
	if state, _, _ := st.member(a.members[2]); state != "faulty" || len(st.Missing) != 1 || st.Missing[0] != 2 {
		t.Fatalf("after raid5d fail: %s is %q, missing %v; want faulty, [2]", a.members[2], state, st.Missing)
	}
	if out, code := s.manage("status"); code != 3 || !strings.Contains(out, "[4/3] [UU_U]") {
		t.Errorf("status of the degraded array: exit %d (want 3)\n%s", code, out)
	}
	// mdadm's order: fail, remove, add.
	s.mustManage("remove", a.members[2])
	if state, _, _ := s.status().member(a.members[2]); state != "" {
		t.Errorf("removed member still listed as %q", state)
	}
	time.Sleep(time.Second)
	if !run.running() {
		t.Fatal("fio finished before the spare was added: the rebuild would not run under load")
	}
	s.mustManage("rebuild", "--speed-min", "20M", "--speed-max", "400M")
	spare := a.newSpare(t, "spare.img")
	s.mustManage("add", spare)
	st = s.waitStatus("the rebuild to start", 10*time.Second, func(st *r5Status) bool {
		return st.Sync != nil && st.Sync.Kind == "rebuild" || st.healthy()
	})
	if st.Sync != nil {
		if state, role, _ := st.member(spare); state != "rebuilding" || role != 2 {
			t.Errorf("the spare during the rebuild: %q in role %d, want rebuilding into 2", state, role)
		}
	}
	t.Logf("rebuild under load: %+v", st.Sync)
	st = s.waitStatus("the rebuild to finish", 90*time.Second, (*r5Status).healthy)
	if !run.running() {
		t.Log("fio finished before the rebuild did")
	}
	if state, role, _ := st.member(spare); state != "active" || role != 2 {
		t.Errorf("the spare after the rebuild: %q in role %d, want active in role 2", state, role)
	}
	checkVerifyJobs(t, run.wait(), 4)

	if out, code := s.manage("scrub", "check", "--wait"); code != 0 || !strings.Contains(out, "0 mismatches") {
		t.Errorf("scrub check after the rebuild: exit %d\n%s", code, out)
	}
	s.stop()

	b := a.withRole(2, spare)
	checkParity(t, b)
	s = b.serve(t)
	if st := s.status(); !st.healthy() {
		t.Errorf("restart on the rebuilt members: %+v", st)
	}
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
}

// TestRebuildResumesAfterKill: the daemon is SIGKILLed in the middle of a rebuild; restarted,
// it resumes from the checkpoint (not from zero) and finishes with every byte verified.
func TestRebuildResumesAfterKill(t *testing.T) {
	need(t, "fio")
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio"), 4)

	s.mustManage("fail", "1")
	// About 16 s for the 63 MiB data area: plenty of time to kill it in the middle.
	s.mustManage("rebuild", "--speed-min", "4M", "--speed-max", "4M")
	spare := a.newSpare(t, "spare.img")
	s.mustManage("add", spare)
	st := s.waitStatus("the rebuild to pass 30%", 60*time.Second, func(st *r5Status) bool {
		return st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Done*10 >= st.Sync.Total*3
	})
	if st.Sync.Done >= st.Sync.Total {
		t.Fatalf("rebuild finished before it could be interrupted: %+v", st.Sync)
	}
	doneAtKill := st.Sync.Done
	s.kill()

	b := a.withRole(1, spare)
	s = b.serve(t, "--sync-speed-max", "4M")
	st = s.status()
	if st.Sync == nil || st.Sync.Kind != "rebuild" {
		t.Fatalf("after the restart no rebuild runs: %+v", st)
	}
	t.Logf("rebuild at the kill: %d of %d bytes; at the restart: %d", doneAtKill, st.Sync.Total, st.Sync.Done)
	if st.Sync.Done <= 0 {
		t.Errorf("the rebuild started over after the restart (done %d; %d at the kill)", st.Sync.Done, doneAtKill)
	}
	s.mustManage("rebuild", "--speed-min", "400M", "--speed-max", "1G")
	s.waitStatus("the resumed rebuild to finish", 60*time.Second, (*r5Status).healthy)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
	if out, code := s.manage("scrub", "check", "--wait"); code != 0 || !strings.Contains(out, "0 mismatches") {
		t.Errorf("scrub check after the resumed rebuild: exit %d\n%s", code, out)
	}
	s.stop()
	checkParity(t, b)
}

// TestScrub: a parity chunk and a data chunk are corrupted in the member files while the daemon
// is stopped; scrub check finds exactly those two stripes, repair fixes them, check then finds
// none, and the member files' parity checks offline.
func TestScrub(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	// Some data in the first 16 stripes.
	data := bytes.Repeat([]byte("scrub me, raid5d! "), 16*stripeData/18+1)[:16*stripeData]
	if err := c.writeAt(data, 0, true); err != nil {
		t.Fatal(err)
	}
	c.disconnect()
	s.stop()

	// Left-symmetric, 4 members: stripe s has parity on member p = 3 - s%4, and data chunk i on
	// member (p+1+i) % 4.
	const parityStripe, dataStripe = 5, 10
	const dataMember = 0 // in stripe 10 (parity on member 1) it holds data chunk 2
	corrupt := func(member int, stripe int64) {
		f, err := os.OpenFile(a.members[member], os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte("CORRUPTED"), dataOffset+stripe*chunkSize+1000); err != nil {
			t.Fatal(err)
		}
	}
	corrupt(3-parityStripe%4, parityStripe) // the parity chunk of stripe 5 (member 2)
	corrupt(dataMember, dataStripe)         // data chunk 2 of stripe 10

	s = a.serve(t)
	out, code := s.manage("scrub", "check", "--wait")
	if code != 5 || !strings.Contains(out, "2 mismatches") {
		t.Errorf("scrub check: exit %d, want 5 and 2 mismatches\n%s", code, out)
	}
	st := s.status()
	if p := st.LastScrub; p == nil || p.Kind != "check" || p.Mismatches != 2 || fmt.Sprint(p.MismatchAt) != fmt.Sprint([]int64{parityStripe, dataStripe}) {
		t.Errorf("last scrub %+v, want check with mismatches at stripes %d and %d", p, parityStripe, dataStripe)
	}
	if out, code := s.manage("status"); !strings.Contains(out, "stripes 5, 10") {
		t.Errorf("status does not list the mismatched stripes (exit %d):\n%s", code, out)
	}
	if out, code := s.manage("scrub", "repair", "--wait"); code != 0 {
		t.Errorf("scrub repair: exit %d\n%s", code, out)
	}
	if out, code := s.manage("scrub", "check", "--wait"); code != 0 || !strings.Contains(out, "0 mismatches") {
		t.Errorf("scrub check after repair: exit %d\n%s", code, out)
	}
	// Repair trusts the data chunks (like md): the corrupted data chunk stays, with matching
	// parity; the other stripes read back as written.
	c, err = wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.readAt(0, uint32(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	c.disconnect()
	want := append([]byte(nil), data...)
	copy(want[dataStripe*stripeData+2*chunkSize+1000:], "CORRUPTED")
	if i := firstDiff(got, want); i >= 0 {
		t.Errorf("after repair the array differs at byte %d (stripe %d)", i, i/stripeData)
	}
	s.stop()
	checkParity(t, a)
}

// writeReplaceData connects to s (closed when the test ends) and writes 32 stripes of a
// pattern at offset 0 (FUA), for a replace to carry over; it returns the client and the data.
func writeReplaceData(t *testing.T, s *server) (*wireClient, []byte) {
	t.Helper()
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	data := bytes.Repeat([]byte("replace me "), 32*stripeData/11+1)[:32*stripeData]
	if err := c.writeAt(data, 0, true); err != nil {
		t.Fatal(err)
	}
	return c, data
}

// checkReplaced checks, once the rebuild of role 0 onto repl has finished (st), that the
// replaced member is no longer active and that data reads back whole through c; then it stops
// the daemon and checks every stripe's parity on the members, repl in role 0.
func checkReplaced(t *testing.T, s *server, c *wireClient, a *array, st *r5Status, repl string, data []byte) {
	t.Helper()
	if state, _, _ := st.member(a.members[0]); state == "active" {
		t.Errorf("replaced member %s still active", a.members[0])
	}
	got, err := c.readAt(0, uint32(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, data); i >= 0 {
		t.Errorf("after the replacement the data differs at byte %d", i)
	}
	c.disconnect()
	s.stop()
	checkParity(t, a.withRole(0, repl))
}

// TestReplaceAndSpeed: raid5d rebuild sets the speed limits the status reports; a scrub of a
// degraded array is refused; raid5d replace moves a role onto a new file and the data survives.
func TestReplaceAndSpeed(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t)
	// Slow, so the rebuild below is still running when the scrub is tried.
	s.mustManage("rebuild", "--speed-min", "3M", "--speed-max", "3M")
	if st := s.status(); st.SyncSpeedMin != 3<<20 || st.SyncSpeedMax != 3<<20 {
		t.Errorf("speed limits after raid5d rebuild: %d, %d; want %d, %d", st.SyncSpeedMin, st.SyncSpeedMax, 3<<20, 3<<20)
	}
	if out, code := s.manage("rebuild", "--speed-min", "9M", "--speed-max", "5M"); code != 2 {
		t.Errorf("min above max: exit %d, want 2\n%s", code, out)
	}

	c, data := writeReplaceData(t, s)
	repl := a.newSpare(t, "new0.img")
	s.mustManage("replace", "0", repl)
	if out, code := s.manage("scrub", "check"); code != 1 || !strings.Contains(out, "degraded") && !strings.Contains(out, "rebuild") {
		t.Errorf("scrub during the replacement's rebuild: exit %d, want 1 (refused: degraded, a rebuild runs)\n%s", code, out)
	}
	if st := s.status(); st.Sync == nil || st.Sync.Kind != "rebuild" || st.Sync.Role != 0 {
		t.Errorf("after replace: sync %+v, want the rebuild of role 0", st.Sync)
	}
	s.mustManage("rebuild", "--speed-min", "500M", "--speed-max", "1G")
	st := s.waitStatus("the replacement's rebuild to finish", 60*time.Second, (*r5Status).healthy)
	if state, role, _ := st.member(repl); state != "active" || role != 0 {
		t.Errorf("replacement %s: %q in role %d, want active in role 0", repl, state, role)
	}
	checkReplaced(t, s, c, a, st, repl, data)
}
