package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Management commands that would lose data or redundancy, with the real daemon: refusals,
// --force, and what the status says afterwards.

// TestFailDuringRebuild: while role 1 is being rebuilt onto a spare, `raid5d fail 3` is
// refused (exit 1, saying why and that --force exists) and changes nothing; `fail --force 3`
// fails the array. Then status says failed in text and JSON (exit 1) and so do the metrics;
// the chunks the array still holds read back byte for byte and the lost ones read EIO; and a
// clean stop does not mark the failed array clean (the offline status reads the superblocks).
// Before, the fail was accepted, status said "degraded" (exit 3), and the stop marked the array
// clean.
func TestFailDuringRebuild(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t, "--metrics", "127.0.0.1:0")
	addr := metricsAddress(t, s)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Stripe 0 is rebuilt before the rebuild stalls; stripe 500 is not. Left-symmetric with 4
	// members: stripe 500 has parity on member 3, data chunk 0 on member 0, chunk 1 on member 1.
	const highOff = 500 * stripeData
	low := bytes.Repeat([]byte("rebuilt "), stripeData/8)
	high := bytes.Repeat([]byte("beyond! "), stripeData/8)
	if err := c.writeAt(low, 0, true); err != nil {
		t.Fatal(err)
	}
	if err := c.writeAt(high, highOff, true); err != nil {
		t.Fatal(err)
	}

	// At 1 byte/s the rebuild does its first batch (15 stripes) and then waits.
	s.mustManage("rebuild", "--speed-min", "1", "--speed-max", "1")
	s.mustManage("fail", "1")
	spare := a.newSpare(t, "spare.img")
	s.mustManage("add", spare)
	s.waitStatus("the rebuild to begin", 30*time.Second, func(st *r5Status) bool {
		return st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Done > 0
	})

	out, code := s.manage("fail", "3")
	if code != 1 || !strings.Contains(out, "would leave the array failed") || !strings.Contains(out, "role 1") || !strings.Contains(out, "--force") {
		t.Errorf("fail 3 during the rebuild of role 1: exit %d, want 1, the reason and the --force hint\n%s", code, out)
	}
	st := s.status()
	if state, _, _ := st.member(a.members[3]); state != "active" || st.State != "degraded" || st.Sync == nil {
		t.Fatalf("after the refused fail: array %q, member 3 %q, sync %+v; want degraded, active, the rebuild", st.State, state, st.Sync)
	}

	s.mustManage("fail", "--force", "3")
	out, code = s.manage("status")
	if code != 1 || !strings.Contains(out, "state:    failed") {
		t.Errorf("status of the failed array: exit %d, want 1 and state failed\n%s", code, out)
	}
	if _, _, code := s.manageSplit("status", "--json"); code != 1 {
		t.Errorf("status --json of the failed array: exit %d, want 1", code)
	}
	if st := s.status(); st.State != "failed" {
		t.Errorf("status --json of the failed array: state %q", st.State)
	}
	fams := scrapeMetrics(t, addr)
	if sample(t, fams, "raid5d_array_state", "state", "failed") != 1 || sample(t, fams, "raid5d_array_state", "state", "degraded") != 0 {
		t.Errorf("metrics of the failed array: raid5d_array_state failed %v, degraded %v",
			sample(t, fams, "raid5d_array_state", "state", "failed"), sample(t, fams, "raid5d_array_state", "state", "degraded"))
	}

	if got, err := c.readAt(0, stripeData); err != nil || !bytes.Equal(got, low) {
		t.Errorf("stripe 0 (rebuilt) of the failed array: %v, or not the data written", err)
	}
	if got, err := c.readAt(highOff, chunkSize); err != nil || !bytes.Equal(got, high[:chunkSize]) {
		t.Errorf("stripe 500, chunk on member 0: %v, or not the data written", err)
	}
	if _, err := c.readAt(highOff+chunkSize, chunkSize); err == nil {
		t.Errorf("stripe 500, chunk on member 1 (lost with member 3) read without an error")
	}
	c.disconnect()
	s.stop()
	if log := s.out.String(); !strings.Contains(log, "the array has failed") || strings.Contains(log, "array marked clean") {
		t.Errorf("the daemon's last words do not say the failed array was left as it was:\n%s", log)
	}

	out, errOut, code := s.manageSplit(append([]string{"status", "--json", spare}, a.members...)...)
	var off struct {
		Source, State string
		Dirty         bool
	}
	if err := json.Unmarshal([]byte(out), &off); err != nil {
		t.Fatalf("offline status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	if code != 1 || off.Source != "offline" || off.State != "failed" || !off.Dirty {
		t.Errorf("offline status after the stop: exit %d, %+v; want 1, offline, failed and dirty (never marked clean)\n%s", code, off, out)
	}

	// The stop left an array serve --force can bring back: member 3 stopped with the array, the
	// rebuild of role 1 resumes, and everything written reads back.
	all := &array{dir: a.dir, members: append(append([]string(nil), a.members...), spare)}
	out, err = runToolErr(raid5dBin, append([]string{"serve", "--socket", filepath.Join(a.dir, "refused.sock"), "--control", s.control}, all.members...)...)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out, "--force") {
		t.Errorf("serve of the failed array without --force: %v, want exit 1 naming --force\n%s", err, out)
	}
	s = all.serve(t, "--force")
	s.mustManage("rebuild", "--speed-min", "200M", "--speed-max", "1G")
	s.waitStatus("the resumed rebuild and the resync", 60*time.Second, (*r5Status).healthy)
	c, err = wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.readAt(0, stripeData); err != nil || !bytes.Equal(got, low) {
		t.Errorf("stripe 0 after serve --force: %v, or not the data written", err)
	}
	if got, err := c.readAt(highOff, stripeData); err != nil || !bytes.Equal(got, high) {
		t.Errorf("stripe 500 after serve --force: %v, or not the data written", err)
	}
	c.disconnect()
	s.stop()
	checkParity(t, &array{dir: a.dir, members: []string{a.members[0], spare, a.members[2], a.members[3]}})
}

// TestReplaceWithSpare: on an array created with --spare A, `raid5d replace 0 B` rebuilds role
// 0 onto B, not onto A, which stays a spare; the data reads back and the members' parity checks.
// Before, A took role 0 and B was left a spare.
func TestReplaceWithSpare(t *testing.T) {
	needRaid5d(t)
	spareA := filepath.Join(t.TempDir(), "spareA.img")
	a := newArrayWith(t, "--spare", spareA)
	withA := &array{dir: a.dir, members: append(append([]string(nil), a.members...), spareA)}
	s := withA.serve(t)
	if state, role, _ := s.status().member(spareA); state != "spare" || role != -1 {
		t.Fatalf("spare A at the start: %q in role %d", state, role)
	}
	c, data := writeReplaceData(t, s)
	repl := a.newSpare(t, "new0.img")
	out := s.mustManage("replace", "0", repl)
	if !strings.Contains(out, "replacing 0 with "+repl) {
		t.Errorf("replace output:\n%s", out)
	}
	st := s.waitStatus("the replacement's rebuild to finish", 60*time.Second, (*r5Status).healthy)
	if state, role, _ := st.member(repl); state != "active" || role != 0 {
		t.Errorf("replacement B %s: %q in role %d, want active in role 0", repl, state, role)
	}
	if state, role, _ := st.member(spareA); state != "spare" || role != -1 {
		t.Errorf("spare A %s: %q in role %d, want still a spare", spareA, state, role)
	}
	checkReplaced(t, s, c, a, st, repl, data)
}

// TestAddRemovedAndForeign: `raid5d add` takes back a member just failed and removed (before,
// it was refused as given twice until a restart), and refuses a file that carries another
// array's superblock unless --force (before, it overwrote it).
func TestAddRemovedAndForeign(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	other := newArray(t)
	s := a.serve(t)
	s.mustManage("fail", a.members[2])
	s.mustManage("remove", a.members[2])
	s.mustManage("add", a.members[2])
	st := s.waitStatus("the rebuild of the member added back", 60*time.Second, (*r5Status).healthy)
	if state, role, _ := st.member(a.members[2]); state != "active" || role != 2 {
		t.Errorf("member added back: %q in role %d, want active in role 2", state, role)
	}

	out, code := s.manage("add", other.members[0])
	if code != 1 || !strings.Contains(out, "superblock") || !strings.Contains(out, "--force") {
		t.Errorf("add of another array's member: exit %d, want 1, the reason and the --force hint\n%s", code, out)
	}
	if state, _, _ := s.status().member(other.members[0]); state != "" {
		t.Errorf("the refused file is listed as %q", state)
	}
	s.mustManage("add", "--force", other.members[0])
	if state, role, _ := s.status().member(other.members[0]); state != "spare" || role != -1 {
		t.Errorf("add --force: %q in role %d, want a spare", state, role)
	}
	s.stop()
	checkParity(t, a)
}
