package test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// raidStatus runs raid5d status on the array's member paths. It returns the output whatever the
// exit status (a degraded array may exit non-zero) and fails only if raid5d could not run.
func raidStatus(t *testing.T, a *array) string {
	t.Helper()
	needRaid5d(t)
	out, err := runToolErr(raid5dBin, append([]string{"status"}, a.members...)...)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("raid5d status: %v\n%s", err, out)
	}
	if err != nil {
		t.Logf("raid5d status exited %d", exit.ExitCode())
	}
	return out
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
		if out := raidStatus(t, a); strings.Contains(strings.ToLower(out), "degraded") {
			t.Errorf("raid5d status says degraded before any member is gone:\n%s", out)
		}
	}
	missing := a.members[1]
	if err := os.Remove(missing); err != nil {
		t.Fatal(err)
	}
	if !standin {
		out := raidStatus(t, a)
		if !strings.Contains(strings.ToLower(out), "degraded") {
			t.Errorf("raid5d status does not say degraded with %s gone:\n%s", missing, out)
		}
		if !strings.Contains(out, filepath.Base(missing)) {
			t.Errorf("raid5d status does not name the missing member %s:\n%s", missing, out)
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
