package test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Member failures injected with the faulty: member spec (a raid5d testing aid):
// faulty:PATH?rfail=all&wfail=all&ctl=FILE fails every data-area read and write of PATH while
// FILE exists.

// faultySpec returns the spec of member i failing reads (rfail) and/or writes (wfail) of its
// whole data area while the returned control file exists (it does not yet).
func (a *array) faultySpec(i int, keys ...string) (spec, ctl string) {
	ctl = filepath.Join(a.dir, "faults-on")
	q := []string{"ctl=" + ctl}
	for _, k := range keys {
		q = append(q, k+"=all")
	}
	return "faulty:" + a.members[i] + "?" + strings.Join(q, "&"), ctl
}

// withSpec returns the array with member i given as spec on the command line.
func (a *array) withSpec(i int, spec string) *array {
	return a.withRole(i, spec)
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestInjectedFailureUnderLoad: while fio writes and verifies, a member's writes start failing
// (fault injection): the daemon marks it faulty and keeps serving degraded; a spare is added and
// rebuilt under the same load; every byte verifies, scrub check finds nothing, the member files'
// parity checks, and the rebuilt array verifies again after a restart.
func TestInjectedFailureUnderLoad(t *testing.T) {
	need(t, "fio")
	needRaid5d(t)
	a := newArray(t)
	spec, ctl := a.faultySpec(1, "wfail")
	s := a.withSpec(1, spec).serve(t, "--sync-speed-min", "20M", "--sync-speed-max", "400M")
	run := startFio(t, s.uri, "verify.fio", "--rate=,2m")

	time.Sleep(1500 * time.Millisecond)
	touch(t, ctl)
	st := s.waitStatus("the failing member to be marked faulty", 20*time.Second, func(st *r5Status) bool {
		state, _, _ := st.member(a.members[1])
		return state == "faulty"
	})
	if len(st.Missing) != 1 || st.Missing[0] != 1 || st.State != "degraded" {
		t.Errorf("after the injected write failure: state %q, missing %v; want degraded, [1]", st.State, st.Missing)
	}
	for _, m := range st.Members {
		if m.Path == a.members[1] && m.WriteErrors == 0 {
			t.Errorf("faulty member shows no write errors: %+v", m)
		}
	}
	if !run.running() {
		t.Fatal("fio finished before the spare was added: the rebuild would not run under load")
	}
	spare := a.newSpare(t, "spare.img")
	s.mustManage("add", spare)
	st = s.waitStatus("the rebuild to finish", 90*time.Second, (*r5Status).healthy)
	if state, role, _ := st.member(spare); state != "active" || role != 1 {
		t.Errorf("the spare after the rebuild: %q in role %d, want active in role 1", state, role)
	}
	if !run.running() {
		t.Log("fio finished before the rebuild did")
	}
	checkVerifyJobs(t, run.wait(), 4)
	if out, code := s.manage("scrub", "check", "--wait"); code != 0 || !strings.Contains(out, "0 mismatches") {
		t.Errorf("scrub check after the rebuild: exit %d\n%s", code, out)
	}
	s.stop()

	b := a.withRole(1, spare)
	checkParity(t, b)
	s = b.serve(t)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
}

// TestReadErrorsHealthyArray: every read of one member fails; the client still reads every byte
// correctly and sees no error (reads are rebuilt from the others), the read errors are counted,
// and (under the read-error limit) the member stays active.
func TestReadErrorsHealthyArray(t *testing.T) {
	need(t, "fio")
	needRaid5d(t)
	a := newArray(t)
	s := a.serve(t)
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio"), 4)
	s.stop()

	spec, ctl := a.faultySpec(2, "rfail")
	touch(t, ctl)
	// A fresh daemon: its cache is cold, so fio's reads reach the members.
	s = a.withSpec(2, spec).serve(t, "--read-error-limit", "1000000000")
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
	st := s.status()
	state, role, readErrors := st.member(a.members[2])
	if state != "active" || role != 2 || !st.healthy() {
		t.Errorf("member with read errors: %q in role %d, array %q missing %v; want it active, the array healthy", state, role, st.State, st.Missing)
	}
	if readErrors == 0 {
		t.Errorf("no read errors counted on %s, whose every read failed", a.members[2])
	}
	t.Logf("%d read errors served by reconstruction", readErrors)
}

// TestDoubleFailure: with one member failed by raid5d fail and a second failing every I/O, the
// array has failed: data on the two lost members reads as EIO, never garbage; data on the others
// still reads correctly; and nothing is written to the failed member's file.
func TestDoubleFailure(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	spec, ctl := a.faultySpec(2, "rfail", "wfail")
	// No cache: every read goes to the members.
	s := a.withSpec(2, spec).serve(t, "--stripe-cache", "off")
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const stripes = 32
	data := make([]byte, stripes*stripeData)
	for i := range data {
		data[i] = byte(i*7 + i/4099)
	}
	if err := c.writeAt(data, 0, true); err != nil {
		t.Fatal(err)
	}

	s.mustManage("fail", "1")
	before := fileSum(t, a.members[1])
	// Degraded: writes still work.
	copy(data[:stripeData], bytes.Repeat([]byte("degraded "), stripeData/9+1))
	if err := c.writeAt(data[:stripeData], 0, true); err != nil {
		t.Fatalf("write to the degraded array: %v", err)
	}

	touch(t, ctl) // member 2 now fails every read and write
	werr := c.writeAt(make([]byte, stripeData), stripes*stripeData, true)
	if !errors.Is(werr, nbdErrno(syscall.EIO)) {
		t.Errorf("write once a second member fails: %v, want EIO", werr)
	}
	if st := s.status(); st.State != "failed" {
		t.Errorf("array state %q after the second failure, want failed (missing %v)", st.State, st.Missing)
	}
	if out, code := s.manage("status"); code != 1 {
		t.Errorf("status of the failed array: exit %d, want 1\n%s", code, out)
	}

	// Every chunk: on member 1 or 2 it is lost (EIO), elsewhere it reads back as written.
	lost, served := 0, 0
	for st := int64(0); st < stripes; st++ {
		p := 3 - st%4 // left-symmetric parity member
		for i := int64(0); i < memberCount-1; i++ {
			member := (p + 1 + i) % 4
			off := st*stripeData + i*chunkSize
			got, err := c.readAt(uint64(off), chunkSize)
			switch {
			case member == 1 || member == 2:
				lost++
				if !errors.Is(err, nbdErrno(syscall.EIO)) {
					t.Errorf("stripe %d chunk %d (member %d, lost): read %v, want EIO", st, i, member, err)
				}
			case err != nil:
				t.Errorf("stripe %d chunk %d (member %d): %v", st, i, member, err)
			default:
				served++
				if !bytes.Equal(got, data[off:off+chunkSize]) {
					t.Errorf("stripe %d chunk %d (member %d): wrong data at byte %d", st, i, member, firstDiff(got, data[off:off+chunkSize]))
				}
			}
		}
	}
	t.Logf("%d chunks lost (EIO), %d served", lost, served)
	c.disconnect()
	if after := fileSum(t, a.members[1]); after != before {
		t.Errorf("the failed member %s was written after it failed", a.members[1])
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}
