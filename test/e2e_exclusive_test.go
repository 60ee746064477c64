package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Exclusive use of members and the modes of the files raid5d makes (issue 13, items 1 and 10).

// refused runs raid5d with args, which must fail with ErrMemberBusy's message naming the holder
// (holder is "locked by pid N ("); it returns the output.
func refused(t *testing.T, holder string, args ...string) string {
	t.Helper()
	out, err := runToolErr(raid5dBin, args...)
	if err == nil {
		t.Fatalf("raid5d %s succeeded on a member in use; want a refusal\n%s", strings.Join(args, " "), out)
	}
	if !strings.Contains(out, "raid: member in use") || !strings.Contains(out, holder) {
		t.Fatalf("raid5d %s: %v; want \"raid: member in use\" naming %s\n%s", strings.Join(args, " "), err, holder, out)
	}
	return out
}

// examineOffline is `raid5d status --json MEMBERS` with no daemon at the control socket.
func examineOffline(t *testing.T, paths ...string) (uuid string, st r5Status) {
	t.Helper()
	args := append([]string{"status", "--json", "--control", filepath.Join(t.TempDir(), "none.sock")}, paths...)
	out, err := runToolErr(raid5dBin, args...)
	if err != nil {
		t.Fatalf("offline raid5d status: %v\n%s", err, out)
	}
	var id struct {
		UUID string `json:"uuid"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("offline raid5d status: %v\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &id); err != nil {
		t.Fatal(err)
	}
	if st.Source != "offline" || st.State != "clean" && st.State != "active" {
		t.Fatalf("offline raid5d status: source %q, state %q; want offline, clean or active\n%s", st.Source, st.State, out)
	}
	return id.UUID, st
}

// TestExclusiveMembers: while raid5d serves an array, its members, spare and journal are its
// own. A second `raid5d serve` on them exits non-zero naming the first daemon's pid and never
// serves; `create --force` with one of its members and another daemon's `add` of its spare,
// journal or a member are refused the same way, writing nothing; offline `raid5d status` of
// the members still works. The files create made are mode 0600.
func TestExclusiveMembers(t *testing.T) {
	needRaid5d(t)
	dir := t.TempDir()
	a := &array{dir: dir}
	for i := range memberCount {
		a.members = append(a.members, filepath.Join(dir, fmt.Sprintf("member%d.img", i)))
	}
	spare, journal := filepath.Join(dir, "spare.img"), filepath.Join(dir, "journal.img")
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K", "--size", "64M", "--spare", spare,
		"--consistency", "journal", "--journal", journal, "--journal-size", "4M"}, a.members...)...)
	for _, p := range append(a.members[:memberCount:memberCount], spare, journal) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("raid5d create made %s mode %04o, want 0600", p, fi.Mode().Perm())
		}
	}
	all := append(a.members[:memberCount:memberCount], spare)
	uuid, _ := examineOffline(t, all...)
	a.members = all
	s := a.serve(t)
	holder := fmt.Sprintf("locked by pid %d (", s.cmd.Process.Pid) // then its command name

	// A second daemon on the same members: it must exit (non-zero, naming the first) and never
	// greet a client.
	sockDir, err := os.MkdirTemp("", "r5d")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock2 := filepath.Join(sockDir, "nbd.sock")
	second := startProc(t, raid5dBin, append([]string{"serve", "--socket", sock2, "--control", filepath.Join(sockDir, "control.sock")}, all...)...)
	deadline := time.Now().Add(startTimeout)
	for second.running() {
		if c, err := wireDial(sock2); err == nil {
			c.abort()
			second.stop(syscall.SIGKILL, stopGrace)
			t.Fatal("a second raid5d serve on the same members serves them")
		}
		if time.Now().After(deadline) {
			second.stop(syscall.SIGKILL, stopGrace)
			t.Fatalf("a second raid5d serve on the same members still runs after %v", startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := second.out.String(); second.err == nil || !strings.Contains(out, "raid: member in use") || !strings.Contains(out, holder) {
		t.Fatalf("second raid5d serve: %v; want a non-zero exit naming %s\n%s", second.err, holder, out)
	}
	t.Logf("second serve: %v: %s", second.err, strings.TrimSpace(second.out.String()))

	// create on a member in use, even with --force: refused before it writes.
	fresh := []string{filepath.Join(dir, "new1.img"), filepath.Join(dir, "new2.img")}
	refused(t, holder, "create", "--force", "--size", "64M", a.members[1], fresh[0], fresh[1])
	for _, p := range fresh {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("refused create left %s behind", p)
		}
	}

	// add of this daemon's spare, journal or member to another daemon's array.
	b := newArray(t)
	sb := b.serve(t)
	for _, p := range []string{spare, journal, a.members[0]} {
		refused(t, holder, "add", p, "--control", sb.control)
	}
	if st := sb.status(); len(st.Members) != memberCount {
		t.Fatalf("the other array has %d members after refused adds, want %d", len(st.Members), memberCount)
	}

	// Offline status reads the superblocks of members in use; nothing was overwritten.
	if got, st := examineOffline(t, all...); got != uuid || len(st.Missing) != 0 {
		t.Fatalf("offline status while serving: uuid %s, missing %v; want %s, none", got, st.Missing, uuid)
	}
	if st := s.status(); !st.healthy() {
		t.Fatalf("the first daemon after the refusals: %+v", st)
	}
}

// TestCreateWideModeWarning: create on existing member files that others may read warns about
// each one, naming its mode; a file already 0600 gets no warning.
func TestCreateWideModeWarning(t *testing.T) {
	needRaid5d(t)
	dir := t.TempDir()
	var members []string
	for i := range memberCount {
		p := filepath.Join(dir, fmt.Sprintf("member%d.img", i))
		mode := os.FileMode(0o644)
		if i == 0 {
			mode = 0o600
		}
		if err := os.WriteFile(p, nil, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		if err := os.Truncate(p, memberSize); err != nil {
			t.Fatal(err)
		}
		members = append(members, p)
	}
	out := runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K"}, members...)...)
	for i, p := range members {
		warned := strings.Contains(out, "warning: member "+p+" is mode 0644")
		if want := i > 0; warned != want {
			t.Errorf("create on %s: warned %v, want %v (mode 0644 warns, 0600 does not)\n%s", p, warned, want, out)
		}
	}
}
