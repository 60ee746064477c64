package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/raid"
)

// fakeArray stands in for a running array behind the control socket. A scrub advances by a
// quarter of the array with every status request and finds mismatches stripes.
type fakeArray struct {
	mu         sync.Mutex // guards all below
	st         control.Status
	calls      []string
	mismatches int64
}

func (f *fakeArray) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

func (f *fakeArray) Fail(m string, force bool) error {
	f.record("fail " + m + forceWord(force))
	return nil
}
func (f *fakeArray) Remove(m string) error { f.record("remove " + m); return nil }
func (f *fakeArray) AddSpare(p string, force bool) error {
	f.record("add " + p + forceWord(force))
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Members = append(f.st.Members, control.MemberStatus{Path: p, Role: 1, State: control.StateRebuilding})
	f.st.Sync = &control.Progress{Kind: "rebuild", Role: 1, Done: 452, Total: 1000, BytesPerSec: 50 << 20, ETASeconds: 3}
	return nil
}
func (f *fakeArray) Replace(m, p string, force bool) error {
	f.record("replace " + m + " " + p + forceWord(force))
	return nil
}

func (f *fakeArray) ReAdd(m string) error {
	f.record("re-add " + m)
	return nil
}

func forceWord(force bool) string {
	if force {
		return " --force"
	}
	return ""
}
func (f *fakeArray) StartScrub(repair bool) error {
	kind := "check"
	if repair {
		kind = "repair"
	}
	f.record("scrub " + kind)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st.Sync != nil {
		return fmt.Errorf("wrapped: %w", control.ErrBusy)
	}
	f.st.Sync = &control.Progress{Kind: kind, Role: -1, Total: 1000}
	return nil
}
func (f *fakeArray) StopScrub() error { f.record("scrub stop"); return nil }
func (f *fakeArray) SetSyncSpeed(lo, hi int64) error {
	f.record(fmt.Sprint("speed ", lo, " ", hi))
	f.mu.Lock()
	defer f.mu.Unlock()
	if lo > 0 {
		f.st.SyncSpeedMin = lo
	}
	if hi > 0 {
		f.st.SyncSpeedMax = hi
	}
	return nil
}

func (f *fakeArray) status() control.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.st.Sync; p != nil && p.Kind != "rebuild" {
		p.Done += p.Total / 4
		if p.Done >= p.Total {
			last := *p
			last.Mismatches = f.mismatches
			f.st.LastScrub, f.st.Sync = &last, nil
		}
	}
	st := f.st
	if st.Sync != nil {
		p := *st.Sync
		st.Sync = &p
	}
	return st
}

func (f *fakeArray) lastCall() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return ""
	}
	return f.calls[len(f.calls)-1]
}

// serveFake serves a healthy four-member fake array on a fresh control socket until the test ends.
func serveFake(t *testing.T) (*fakeArray, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "r5ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "c.sock")
	f := &fakeArray{st: control.Status{
		UUID: "5889fe24-a8e0-5658-aa76-dcde00d70286", State: "active", Level: 5, Disks: 4, Chunk: 64 << 10,
		Layout: "left-symmetric", Size: 3 * 63 << 20, SyncSpeedMin: 1 << 20, SyncSpeedMax: 200 << 20,
		Daemon: control.Daemon{PID: 42, Export: "raid5d", Address: "nbd+unix:///?socket=/x"},
	}}
	for r := range 4 {
		f.st.Members = append(f.st.Members, control.MemberStatus{Path: fmt.Sprintf("/m%d", r), Role: r, State: control.StateActive})
	}
	ln, err := control.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&control.Server{Array: f, Status: f.status}).Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return f, sock
}

func TestManageCommands(t *testing.T) {
	f, sock := serveFake(t)
	abs, err := filepath.Abs("spare.img")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		call string // what the array got
		out  string // in stdout
	}{
		{[]string{"fail", "2"}, "fail 2", "marked faulty: 2"},
		{[]string{"fail", "/dev/sdc"}, "fail /dev/sdc", "marked faulty: /dev/sdc"},
		{[]string{"fail", "faulty:spare.img?wfail=all"}, "fail faulty:" + abs + "?wfail=all", "marked faulty: faulty:spare.img"},
		{[]string{"remove", "/m2"}, "remove /m2", "removed: /m2"},
		{[]string{"add", "spare.img"}, "add " + abs, "added spare: " + abs},
		{[]string{"replace", "1", "spare.img"}, "replace 1 " + abs, "replacing 1 with " + abs},
		{[]string{"fail", "--force", "3"}, "fail 3 --force", "marked faulty: 3"},
		{[]string{"add", "--force", "spare.img"}, "add " + abs + " --force", "added spare: " + abs},
		{[]string{"replace", "--force", "1", "spare.img"}, "replace 1 " + abs + " --force", "replacing 1 with " + abs},
		{[]string{"scrub", "stop"}, "scrub stop", "scrub stopped"},
		{[]string{"rebuild", "--speed-min", "2M", "--speed-max", "300M"}, fmt.Sprint("speed ", 2<<20, " ", 300<<20), "min 2M/s, max 300M/s"},
		{[]string{"rebuild", "--speed-max", "10M"}, fmt.Sprint("speed 0 ", 10<<20), "min 2M/s, max 10M/s"},
	} {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			code, out, errOut := runCLI(t, append(tc.args, "--control", sock)...)
			if code != 0 {
				t.Fatalf("exit %d: %s%s", code, out, errOut)
			}
			if got := f.lastCall(); got != tc.call {
				t.Errorf("array got %q, want %q", got, tc.call)
			}
			if !strings.Contains(out, tc.out) {
				t.Errorf("output lacks %q:\n%s", tc.out, out)
			}
		})
	}
}

func TestScrubWait(t *testing.T) {
	for _, tc := range []struct {
		action     string
		mismatches int64
		code       int
		out        string
	}{
		{"check", 0, 0, "scrub check finished: 0 mismatches"},
		{"check", 3, exitMismatches, "scrub check finished: 3 mismatches"},
		{"check", 1, exitMismatches, "scrub check finished: 1 mismatch\n"},
		{"repair", 3, 0, "scrub repair finished: 3 mismatches"},
	} {
		t.Run(fmt.Sprint(tc.action, tc.mismatches), func(t *testing.T) {
			f, sock := serveFake(t)
			f.mismatches = tc.mismatches
			code, out, errOut := runCLI(t, "scrub", tc.action, "--wait", "--poll", "1ms", "--control", sock)
			if code != tc.code || !strings.Contains(out, tc.out) {
				t.Fatalf("exit %d (want %d), output lacks %q:\n%s%s", code, tc.code, tc.out, out, errOut)
			}
		})
	}
}

func TestManageErrors(t *testing.T) {
	f, sock := serveFake(t)
	f.st.Sync = &control.Progress{Kind: "rebuild", Total: 10}
	none := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"scrub", "check", "--control", sock}, 1, "busy"},
		{[]string{"fail", "--control", none, "1"}, exitNoDaemon, "Point --control at"},
		{[]string{"status", "--control", none}, 2, "no members given"},
		{[]string{"fail", "--control", sock}, 2, "want one MEMBER"},
		{[]string{"replace", "--control", sock, "1"}, 2, "want MEMBER and PATH"},
		{[]string{"scrub", "--control", sock, "fix"}, 2, `scrub "fix"`},
		{[]string{"scrub", "--control", sock, "stop", "--wait"}, 2, "--wait goes with check or repair"},
		{[]string{"rebuild", "--control", sock}, 2, "give --speed-min"},
		{[]string{"rebuild", "--control", sock, "--speed-min", "5M", "--speed-max", "1M"}, 2, "is above"},
		{[]string{"rebuild", "--control", sock, "--speed-min", "fast"}, 2, "invalid size"},
	} {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.contains) {
				t.Fatalf("exit %d (want %d); output lacks %q:\n%s%s", code, tc.code, tc.contains, out, errOut)
			}
		})
	}
}

func TestManageHelp(t *testing.T) {
	for _, tc := range []struct {
		cmd   string
		flags []string
	}{
		{"status", []string{"-control path", "-json", "-export name", "Exit status"}},
		{"fail", []string{"-control path", "role number", "Exit status"}},
		{"remove", []string{"-control path", "Exit status"}},
		{"add", []string{"-control path", "spare", "Exit status"}},
		{"replace", []string{"-control path", "Exit status"}},
		{"scrub", []string{"-wait", "-control path", "mismatches", "Exit status"}},
		{"rebuild", []string{"-speed-min rate", "-speed-max rate", "Exit status"}},
		{"serve", []string{"-control path", "/run/raid5d/EXPORT.sock", "XDG_RUNTIME_DIR"}},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.cmd, "--help")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, s := range tc.flags {
				if !strings.Contains(out, s) {
					t.Errorf("%s --help lacks %q:\n%s", tc.cmd, s, out)
				}
			}
		})
	}
}

func TestStatusOnline(t *testing.T) {
	f, sock := serveFake(t)
	f.st.State = "degraded"
	f.st.Members[1].State = control.StateFaulty
	f.st.Members[1].ReadErrors = 17
	f.st.Missing = []int{1}
	if err := f.AddSpare("/spare", false); err != nil {
		t.Fatal(err)
	}
	f.st.LastScrub = &control.Progress{Kind: "check", Role: -1, Done: 10, Total: 10, Mismatches: 2, MismatchAt: []int64{4, 9}}

	code, out, errOut := runCLI(t, "status", "--control", sock)
	if code != 3 {
		t.Errorf("degraded array: exit %d, want 3\n%s", code, errOut)
	}
	for _, want := range []string{
		"online: daemon pid 42",
		"degraded, rebuilding",
		"[4/3] [U_UU]",
		"[=========>          ]  45.2%",
		"50M/s, ETA 3s",
		"last scrub: check finished, 2 mismatches (stripes 4, 9)",
		"rebuilding into role 1",
		"missing: role 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if !regexpLine(out, "/m1", "faulty", "17") {
		t.Errorf("no member line shows /m1 faulty with 17 read errors:\n%s", out)
	}

	// --json is the daemon's status, whole, plus its source.
	code, out, _ = runCLI(t, "status", "--json", "--control", sock)
	if code != 3 {
		t.Errorf("--json: exit %d, want 3", code)
	}
	var got control.Status
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	want := f.status()
	want.Source = "online"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("status --json:\n%+v\nwant\n%+v", got, want)
	}
}

// regexpLine reports whether one line of out contains every word.
func regexpLine(out string, words ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			return true
		}
	}
	return false
}

// createThree creates a 3-member array of 4M members (raid5d create) and returns their paths.
func createThree(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	var ms []string
	for i := range 3 {
		ms = append(ms, filepath.Join(dir, fmt.Sprint("m", i)))
	}
	if code, out, errOut := runCLI(t, append([]string{"create", "--size", "4M"}, ms...)...); code != 0 {
		t.Fatalf("create: exit %d: %s%s", code, out, errOut)
	}
	return ms
}

func TestStatusOfflineWhenDaemonServesOthers(t *testing.T) {
	_, sock := serveFake(t)
	ms := createThree(t)
	code, out, errOut := runCLI(t, append([]string{"status", "--control", sock}, ms...)...)
	if code != 0 || !strings.HasPrefix(out, "offline: the daemon at "+sock+" serves other members") {
		t.Fatalf("exit %d:\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"status", "--json", "--control", filepath.Join(filepath.Dir(ms[0]), "none")}, ms...)...)
	var st control.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("offline --json: exit %d, %v\n%s", code, err, out)
	}
	if st.Source != "offline" || len(st.Members) != 3 || st.Members[2].Path != ms[2] || st.Disks != 3 {
		t.Errorf("offline --json: %+v", st)
	}
}

func TestProgressBar(t *testing.T) {
	for _, tc := range []struct {
		pct  float64
		want string
	}{
		{0, "[>                   ]"},
		{4.9, "[>                   ]"},
		{5, "[=>                  ]"},
		{45.2, "[=========>          ]"},
		{99.9, "[===================>]"},
		{100, "[====================]"},
		{150, "[====================]"},
		{-1, "[>                   ]"},
	} {
		if got := progressBar(tc.pct); got != tc.want {
			t.Errorf("progressBar(%v) = %q, want %q", tc.pct, got, tc.want)
		}
	}
}

func TestDefaultControlPath(t *testing.T) {
	for _, tc := range []struct {
		euid    int
		haveRun bool
		xdg     string
		want    string
	}{
		{0, true, "/run/user/0", "/run/raid5d/vol.sock"},
		{0, false, "", "/tmp/raid5d-0/vol.sock"},
		{1000, true, "/run/user/1000", "/run/user/1000/raid5d/vol.sock"},
		{1000, true, "", "/tmp/raid5d-1000/vol.sock"},
	} {
		if got := controlPathFor("vol", tc.euid, tc.haveRun, tc.xdg, "/tmp"); got != tc.want {
			t.Errorf("controlPathFor(euid %d, /run %v, xdg %q) = %q, want %q", tc.euid, tc.haveRun, tc.xdg, got, tc.want)
		}
	}
}

func TestCreateWithSpares(t *testing.T) {
	dir := t.TempDir()
	var ms []string
	for i := range 3 {
		ms = append(ms, filepath.Join(dir, fmt.Sprint("m", i)))
	}
	s0, s1 := filepath.Join(dir, "s0"), filepath.Join(dir, "s1")
	code, out, errOut := runCLI(t, append([]string{"create", "--size", "4M", "--spare", s0, "--spare", s1}, ms...)...)
	if code != 0 || !strings.Contains(out, "spare:  "+s1) {
		t.Fatalf("create --spare: exit %d\n%s%s", code, out, errOut)
	}
	none := filepath.Join(dir, "none.sock")
	code, out, _ = runCLI(t, append([]string{"status", "--json", "--control", none, s0, s1}, ms...)...)
	var st control.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("status --json: exit %d, %v\n%s", code, err, out)
	}
	spares := 0
	for _, m := range st.Members {
		if m.Path == s0 || m.Path == s1 {
			if m.Role != -1 || m.State != control.StateSpare {
				t.Errorf("spare %s: role %d state %q, want -1 spare", m.Path, m.Role, m.State)
			}
			spares++
		}
	}
	if spares != 2 || len(st.Missing) != 0 {
		t.Errorf("status lists %d spares (want 2), missing %v:\n%s", spares, st.Missing, out)
	}
	_, out, _ = runCLI(t, append([]string{"status", "--control", none, s0}, ms...)...)
	if !regexpLine(out, "-", s0, "spare") {
		t.Errorf("status does not show %s as a spare:\n%s", s0, out)
	}
}

// TestStoppedMessage: serve's last log line says what the stop left in the superblocks, and
// never that a failed (or still dirty, or read-only) array was marked clean.
func TestStoppedMessage(t *testing.T) {
	for _, tc := range []struct {
		st   raid.Status
		want string
	}{
		{raid.Status{State: raid.StateFailed, Dirty: true}, "not marked clean"},
		{raid.Status{State: raid.StateDegraded, ReadOnly: true}, "nothing written"},
		{raid.Status{State: raid.StateActive, Dirty: true, Unclean: true}, "stays marked dirty"},
		{raid.Status{State: raid.StateClean}, "array marked clean"},
	} {
		if got := stoppedMessage(tc.st); !strings.Contains(got, tc.want) {
			t.Errorf("%v (dirty %v, read-only %v): %q, want %q in it", tc.st.State, tc.st.Dirty, tc.st.ReadOnly, got, tc.want)
		}
	}
}

// TestDirtyDegradedCLI: members copied while the array was being written (a power cut: dirty
// superblocks, write-intent bits set), one of them gone. Offline status says serve refuses
// them and why; serve refuses them (raid.ErrDirtyDegraded, naming the missing path and
// --force) and exits.
func TestDirtyDegradedCLI(t *testing.T) {
	dir, crash := t.TempDir(), t.TempDir()
	var ms, copies []string
	for i := range 3 {
		ms = append(ms, filepath.Join(dir, fmt.Sprint("m", i)))
		copies = append(copies, filepath.Join(crash, fmt.Sprint("m", i)))
	}
	if code, out, errOut := runCLI(t, append([]string{"create", "--size", "4M"}, ms...)...); code != 0 {
		t.Fatalf("create: exit %d: %s%s", code, out, errOut)
	}
	a, err := raid.Assemble(ms, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if i == 1 {
			continue // the member that does not come back
		}
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copies[i], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	code, out, errOut := runCLI(t, append([]string{"status", "--control", filepath.Join(crash, "none")}, copies...)...)
	if code == 0 || !strings.Contains(out, "not shut down cleanly: serve refuses it") {
		t.Fatalf("offline status of the crashed members, one gone: exit %d\n%s%s", code, out, errOut)
	}
	// The JSON carries it too, for scripts: dirty_degraded, and the bytes at risk (the
	// write's region).
	code, out, errOut = runCLI(t, append([]string{"status", "--json", "--control", filepath.Join(crash, "none")}, copies...)...)
	var st control.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code == 0 || !st.DirtyDegraded || len(st.AtRisk) == 0 ||
		st.AtRisk[0].Off != 0 || st.AtRisk[0].Len < 64<<10 || st.Consistency != raid.ConsistencyBitmap {
		t.Fatalf("offline status --json of the crashed members, one gone: exit %d, %v: %+v\n%s%s", code, err, st, out, errOut)
	}
	// Whole, it is not refused.
	if code, out, errOut := runCLI(t, append([]string{"status", "--json", "--control", filepath.Join(crash, "none")}, append(copies[:1:1], ms[1], copies[2])...)...); code != 0 || strings.Contains(out, "dirty_degraded") {
		t.Fatalf("offline status --json of the crashed members, whole: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--control", filepath.Join(crash, "ctl.sock")}, copies...)...)
	if code == 0 || !strings.Contains(errOut, "dirty array with a member missing") || !strings.Contains(errOut, copies[1]) || !strings.Contains(errOut, "--force") {
		t.Fatalf("serve of the crashed members, one gone: exit %d\n%s%s", code, out, errOut)
	}
}

// TestScrubCheckOfflineCLI: scrub check MEMBER... of a stopped array counts its mismatches
// in words ("1 mismatch", "2 mismatches") and exits 5 naming them.
func TestScrubCheckOfflineCLI(t *testing.T) {
	ms := createThree(t)
	rep, err := raid.Examine(ms)
	if err != nil {
		t.Fatal(err)
	}
	chunk := rep.Layout.ChunkSize()
	check := func(code int, want ...string) {
		t.Helper()
		got, out, errOut := runCLI(t, append([]string{"scrub", "check", "--control", filepath.Join(filepath.Dir(ms[0]), "none")}, ms...)...)
		for _, w := range want {
			if !strings.Contains(out+errOut, w) {
				t.Errorf("output lacks %q", w)
			}
		}
		if got != code || t.Failed() {
			t.Fatalf("scrub check offline: exit %d, want %d:\n%s%s", got, code, out, errOut)
		}
	}
	check(0, "; 0 mismatches elsewhere\n")
	flip := func(stripe int64) {
		f, err := os.OpenFile(ms[0], os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte{0x5a}, raid.DataOffset+stripe*chunk+7); err != nil {
			t.Fatal(err)
		}
	}
	flip(3)
	check(exitMismatches, "; 1 mismatch elsewhere\n", ": stripe 3 (array bytes", "found 1 stripe with mismatched parity")
	flip(5)
	check(exitMismatches, "; 2 mismatches elsewhere\n", "stripe 3 (array bytes", "stripe 5 (array bytes", "found 2 stripes with mismatched parity")
}
