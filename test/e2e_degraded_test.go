package test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// raidStatus runs raid5d status on the array's member paths and returns its output, with the
// array's directory replaced by "<dir>" (test names end up in paths), and its exit status
// (documented: 0 clean or active, 3 degraded). It fails only if raid5d could not run.
func raidStatus(t *testing.T, a *array) (string, int) {
	t.Helper()
	needRaid5d(t)
	out, err := runToolErr(raid5dBin, append([]string{"status"}, a.members...)...)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("raid5d status: %v\n%s", err, out)
	}
	code := 0
	if err != nil {
		code = exit.ExitCode()
	}
	return strings.ReplaceAll(out, a.dir, "<dir>"), code
}

// TestDegraded loses a member between two runs of the daemon: every block written before must
// still verify, new writes must work, and both must survive another restart.
func TestDegraded(t *testing.T) {
	need(t, "fio")
	a := newArray(t)
	s := a.serve(t)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio"), 4)
	s.stop()

	if !standin {
		out, code := raidStatus(t, a)
		if code != 0 || strings.Contains(strings.ToLower(out), "degraded") {
			t.Errorf("raid5d status with every member present: exit %d (want 0)\n%s", code, out)
		}
		if !strings.Contains(out, strconv.Itoa(arraySize)) {
			t.Errorf("raid5d status does not give the array size %d:\n%s", arraySize, out)
		}
	}
	missing := a.members[1]
	if err := os.Remove(missing); err != nil {
		t.Fatal(err)
	}
	if !standin {
		out, code := raidStatus(t, a)
		if code != 3 || !strings.Contains(strings.ToLower(out), "degraded") {
			t.Errorf("raid5d status with %s gone: exit %d, want 3 and \"degraded\":\n%s", missing, code, out)
		}
		named := false
		for _, line := range strings.Split(out, "\n") {
			named = named || strings.Contains(line, filepath.Base(missing)) && strings.Contains(line, "missing")
		}
		if !named {
			t.Errorf("raid5d status has no line naming %s as missing:\n%s", filepath.Base(missing), out)
		}
	}

	// The deleted path stays on the command line: it is the missing member.
	s = a.serve(t)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
	checkVerifyJobs(t, runFio(t, s.uri, "verify-second.fio"), 2)
	s.stop()

	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serve recreated the missing member %s: %v", missing, err)
	}
	s = a.serve(t)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
	checkVerifyJobs(t, runFio(t, s.uri, "verify-second.fio", "--verify_only"), 2)
}
