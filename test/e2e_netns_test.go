package test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests of an array across hosts, as it will be used: every member an export on a host of
// its own (nbdkit's file plugin, or nbd-server), raid5d serve on another, and the clients (fio's
// nbd engine, qemu-io, raid5d bench) on a third, all talking over veth links in a lab of
// network namespaces (netns_test.go).

// netTimeout is the lab tests' --member-timeout: short, so that a lost host costs the clients
// little, and still many times a member request's time on a loaded machine.
const netTimeout = 3 * time.Second

// startLoad runs fio's job on the client host in the background, and waits until the daemon has
// written 8 MiB to its members (of the ~85 MiB that fio/verify.fio makes them write): the load is
// under way.
func (n *netArray) startLoad(t *testing.T, s *server, job string, extra ...string) *fioRun {
	t.Helper()
	run := startFioIn(t, n.client.prefix(), s.uri, job, extra...)
	waitFor(t, "fio to write 8 MiB to the members", 2*time.Minute, s.proc, func() bool {
		if !run.running() {
			run.wait()
			t.Fatal("fio ended before the load was under way")
		}
		return s.crashStatus().Counters.MemberBytesWritten >= 8<<20
	})
	return run
}

// longestRequest is the longest time one of the jobs' I/Os took.
func longestRequest(jobs []fioJob) time.Duration {
	var worst float64
	for _, j := range jobs {
		worst = max(worst, j.Read.Lat.Max, j.Write.Lat.Max)
	}
	return time.Duration(worst)
}

// TestNetnsHostLoss: an array of four members on four hosts, under fio's verifying writes
// (fio/verify.fio, four jobs on four connections from the client host); a member host is lost
// while they run: its link cut (veth down: its requests get no answer, nothing closes, only
// the member timeout ends them; nbd-server's host) or its server SIGKILLed (the connection
// breaks; an nbdkit host). fio sees no error, no request waits much past one member timeout,
// every block verifies, and the array is degraded with that member faulty. A spare on a fifth
// host is added and rebuilt into the lost member's role; fio verifies every block again,
// scrub check finds 0 mismatches, and every stripe's parity matches on the member files.
func TestNetnsHostLoss(t *testing.T) {
	t.Run("veth-down", func(t *testing.T) { netHostLoss(t, memberCount-1, false) })
	t.Run("sigkill", func(t *testing.T) { netHostLoss(t, 1, true) })
}

func netHostLoss(t *testing.T, victim int, kill bool) {
	need(t, "fio")
	n := newNetArray(t, nil)
	s := n.serve(t, "--member-timeout", netTimeout.String())
	lost := n.members[victim]
	run := n.startLoad(t, s, "verify.fio")
	if kill {
		if err := lost.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	} else {
		lost.host.cut(t)
	}
	jobs := run.wait()
	checkVerifyJobs(t, jobs, 4)
	worst := longestRequest(jobs)
	t.Logf("longest fio request %v (member timeout %v)", worst, netTimeout)
	if worst > netTimeout+30*time.Second {
		t.Errorf("a fio request took %v: more than one member timeout (%v) and a margin", worst, netTimeout)
	}
	st := s.waitStatus("the lost member to be failed", 2*time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(lost.uri)
		return state == "faulty"
	})
	if st.State != "degraded" || len(st.Missing) != 1 || st.Missing[0] != victim {
		t.Fatalf("after member %d's host was lost: state %q, missing %v; want degraded, [%d]", victim, st.State, st.Missing, victim)
	}
	waitFor(t, "the lost member's link down", time.Minute, s.proc, func() bool {
		r := s.remoteStatus().member(t, lost.uri).Remote
		return r.State == "down" && r.Connections == 0 && r.InFlight == 0
	})

	spare := n.lab.memberHost(t, "spare", false)
	s.mustManage("add", spare.uri)
	st = s.waitStatus("the rebuild onto the spare host", 2*time.Minute, (*r5Status).healthy)
	if state, role, _ := st.member(spare.uri); state != "active" || role != victim {
		t.Fatalf("the spare after the rebuild: %q in role %d, want active in role %d", state, role, victim)
	}
	if r := s.remoteStatus().member(t, spare.uri).Remote; r.State != "connected" || r.Requests == 0 || r.Errors != 0 {
		t.Fatalf("the spare after the rebuild: remote %+v, want connected, requests answered, none failed", r)
	}
	checkVerifyJobs(t, n.fio(t, s, "verify.fio", "--verify_only"), 4)
	s.scrubClean()
	s.stop()
	files := n.files()
	files.members[victim] = spare.file
	checkParity(t, files)
}

// TestNetnsHostReturns: a member host is cut off (veth down), 1% of the array's write-intent
// regions are written by qemu-io from the client host (the first write waits one member
// timeout, then the member is failed), and the host comes back with its server and file as
// they were. `raid5d re-add` on the running daemon (/re-add), or the daemon itself under
// --auto-re-add (/auto-re-add), resyncs exactly those regions onto it (status's last
// rebuild: the regions' bytes per member); then, with each member in turn left out (the
// array assembled degraded and read-only without it), fio verifies every block it wrote
// before and qemu-io every region written while the host was away; every stripe's parity
// matches on the member files.
func TestNetnsHostReturns(t *testing.T) {
	t.Run("re-add", func(t *testing.T) { netHostReturns(t, false) })
	t.Run("auto-re-add", func(t *testing.T) { netHostReturns(t, true) })
}

func netHostReturns(t *testing.T, auto bool) {
	need(t, "fio", "qemu-io")
	n := newNetArray(t, nil)
	flags := []string{"--member-timeout", netTimeout.String()}
	if auto {
		flags = append(flags, "--auto-re-add", "--auto-re-add-interval", "200ms")
	}
	s := n.serve(t, flags...)
	checkVerifyJobs(t, n.fio(t, s, "verify.fio"), 4) // [0, 64M)
	waitFor(t, "the bitmap's cleaner to clear the fill's bits", 60*time.Second, s.proc, func() bool {
		return bitsSet(t, s) == 0
	})
	bm := s.crashStatus().Bitmap
	if bm == nil || bm.RegionBytes <= 0 || bm.Regions < 200 {
		t.Fatalf("status shows bitmap %+v, want one of at least 200 regions", bm)
	}
	// 1% of the regions, spread over the half of the array fio did not write.
	regions := int64(bm.Regions)
	count := regions / 100
	var writes, reads []qemuOp
	for i := range count {
		off := (regions/2 + i*(regions/2)/count) * bm.RegionBytes
		p := byte(0x60 + i)
		writes = append(writes, qemuOp{kind: "write", off: off, n: bm.RegionBytes, pattern: p})
		reads = append(reads, qemuOp{kind: "read", off: off, n: bm.RegionBytes, pattern: p},
			qemuOp{kind: "read", off: off + bm.RegionBytes, n: 4096, pattern: 0}) // and its neighbour untouched
	}

	const away = 2
	n.members[away].host.cut(t)
	qemuIOIn(t, n.client.prefix(), s.uri, writes)
	s.waitStatus("the cut-off member to be failed", 2*time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(n.uris[away])
		return state == "faulty"
	})
	time.Sleep(5 * time.Second) // the cleaner, every second, clears regions idle 3 s: not while degraded
	if got := bitsSet(t, s); int64(got) != count {
		t.Fatalf("%d write-intent bits set while member %d was away, want the %d regions written", got, away, count)
	}
	if auto {
		s.waitStatus("the away member probed", time.Minute, func(*r5Status) bool {
			ar := s.autoReAdd()
			return ar != nil && len(ar.Members) == 1 && ar.Members[0].Member == n.uris[away] && ar.Members[0].Probes > 0
		})
	}
	n.members[away].host.restore(t)
	if !auto {
		// As an operator would, once the host answers again.
		waitFor(t, "the host to answer again", time.Minute, s.proc, n.members[away].reachable)
		s.mustManage("re-add", n.uris[away])
	}
	lr := s.waitStatus("the re-add to finish", 2*time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(n.uris[away])
		return state == "active" && st.healthy() && st.LastRebuild != nil
	}).LastRebuild
	want := count * bm.RegionBytes / (memberCount - 1) // member bytes per region
	if lr == nil || !lr.ReAdd || lr.Resynced != want {
		t.Fatalf("last rebuild %+v, want a re-add of the %d regions written while away (%d bytes)", lr, count, want)
	}
	t.Logf("re-add resynced %d of the member's %d bytes (%.2f%%)", lr.Resynced, lr.Total, 100*float64(lr.Resynced)/float64(lr.Total))
	s.stop()

	for i := range memberCount {
		s := n.serveWithout(t, i, "--read-only")
		if st := s.status(); st.State != "degraded" || len(st.Missing) != 1 || st.Missing[0] != i {
			t.Fatalf("served without member %d: state %q, missing %v; want degraded, [%d]", i, st.State, st.Missing, i)
		}
		checkVerifyJobs(t, n.fio(t, s, "verify.fio", "--verify_only"), 4)
		qemuIOIn(t, n.client.prefix(), s.uri, reads, "-r")
		s.stop()
	}
	checkParity(t, n.files())
}

// TestNetnsFlaky: member 1's server (nbdkit) sits behind the delay filter (2 ms on every read
// and write), the rate filter (400 Mbit/s), the error filter (EIO on 2% of reads while a file
// exists) and the pause filter (stalls on demand). With a read-error limit far away, three
// stalls of 1 s and the link down for half a second (all under the 4 s member timeout) while
// fio's verifying writes run, fio sees no error and verifies every block, and the member is
// still active with its read errors counted, by the array and as failed requests in its remote
// status. Restarted with a read-error limit of 5, fio's verifying reads take it past the limit:
// the member is failed, fio still sees no error and every block verifies. With the errors off
// it is re-added; scrub check finds 0 mismatches and every stripe's parity matches on the
// member files.
func TestNetnsFlaky(t *testing.T) {
	need(t, "fio")
	ctlDir, err := os.MkdirTemp("", "r5p") // a unix socket path: short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ctlDir) })
	pauseCtl, eio := filepath.Join(ctlDir, "pause.sock"), filepath.Join(ctlDir, "eio")
	const flaky = 1
	n := newNetArray(t, map[int][]string{flaky: {
		"--filter=pause", "--filter=error", "--filter=rate", "--filter=delay",
		"pause-control=" + pauseCtl, "error-pread-rate=2%", "error-pread-file=" + eio,
		"rate=400M", "delay-read=2ms", "delay-write=2ms",
	}})
	uri := n.uris[flaky]
	const timeout = 4 * time.Second
	// A small stripe cache, so that fio's verifying reads reach the members.
	flags := []string{"--member-timeout", timeout.String(), "--stripe-cache", "32"}

	// The errors start once the array is assembled: a superblock that cannot be read makes a
	// missing member, which is another test.
	s := n.serve(t, append(flags, "--read-error-limit", "1000000")...)
	touch(t, eio)
	run := n.startLoad(t, s, "verify.fio")
	for i := range 4 {
		if !run.running() {
			break
		}
		if i == 2 {
			// The link itself down for a moment: TCP resends what it dropped.
			n.members[flaky].host.cut(t)
			time.Sleep(500 * time.Millisecond)
			n.members[flaky].host.restore(t)
		} else {
			pauseMember(t, pauseCtl, time.Second)
		}
		time.Sleep(time.Second)
	}
	checkVerifyJobs(t, run.wait(), 4)
	st := s.status()
	state, _, readErrors := st.member(uri)
	if state != "active" || readErrors == 0 || st.State == "degraded" {
		t.Fatalf("after the load within the limits: member %d %q with %d read errors, array %q; want active with some, not degraded",
			flaky, state, readErrors, st.State)
	}
	r := s.remoteStatus().member(t, uri).Remote
	if r.State != "connected" || r.Errors < readErrors {
		t.Fatalf("after the load within the limits: member %d remote %+v, want connected with at least the %d read errors as failed requests",
			flaky, r, readErrors)
	}
	t.Logf("within the limits: %d read errors counted (%d failed requests of %d), the member active; latency over the last %.0f s: mean %.1f ms, max %.0f ms",
		readErrors, r.Errors, r.Requests, r.Latency.Window, 1000*r.Latency.Mean, 1000*r.Latency.Max)
	if err := os.Remove(eio); err != nil {
		t.Fatal(err)
	}
	s.stop()

	s = n.serve(t, append(flags, "--read-error-limit", "5")...)
	touch(t, eio)
	checkVerifyJobs(t, n.fio(t, s, "verify.fio", "--verify_only"), 4)
	st = s.status()
	if state, _, readErrors = st.member(uri); state != "faulty" || readErrors < 5 || st.State != "degraded" {
		t.Fatalf("after reads past the read-error limit: member %d %q with %d read errors, array %q; want faulty with at least 5, degraded",
			flaky, state, readErrors, st.State)
	}
	t.Logf("past the limit: failed at %d read errors", readErrors)
	if err := os.Remove(eio); err != nil {
		t.Fatal(err)
	}
	s.mustManage("re-add", uri)
	s.waitStatus("the re-add to finish", 2*time.Minute, (*r5Status).healthy)
	s.scrubClean()
	s.stop()
	checkParity(t, n.files())
}

// pauseMember stalls an nbdkit server behind the pause filter for d: every request it receives
// meanwhile waits.
func pauseMember(t *testing.T, ctl string, d time.Duration) {
	t.Helper()
	c, err := net.DialTimeout("unix", ctl, wireTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d + 2*wireTimeout))
	cmd := func(send, want byte) {
		t.Helper()
		if _, err := c.Write([]byte{send}); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil || b[0] != want {
			t.Fatalf("pause filter: sent %q, got %q: %v", send, b[0], err)
		}
	}
	cmd('p', 'P') // answered once the requests under way are done
	time.Sleep(d)
	cmd('r', 'R')
}

// TestNetnsFilesystem: ext4 on the array from the client host, through nbdfuse (in the
// client's network namespace) and a loop device: mkfs, then a member host is cut off and a
// tree of files copied in and synced (the first writes wait one member timeout), fsck -fn
// clean; the daemon restarted with that host still away assembles degraded (the member
// unreachable), and fsck and every file's checksum pass again through a new nbdfuse.
func TestNetnsFilesystem(t *testing.T) {
	needBlockDevices(t)
	need(t, "nsenter", "sync")
	src := t.TempDir()
	sums := makeTree(t, src, 20261201)
	n := newNetArray(t, nil)
	flags := []string{"--member-timeout", netTimeout.String()}
	s := n.serve(t, flags...)
	d := attachLoopIn(t, n.client.netPrefix(), s.uri)
	runTool(t, "mkfs.ext4", "-q", d.dev)
	mnt := d.mount(t)
	const lost = 0
	n.members[lost].host.cut(t)
	runTool(t, "cp", "-a", src+"/.", mnt)
	runTool(t, "sync", "-f", mnt)
	checkTree(t, mnt, sums)
	d.umount(t, mnt)
	runTool(t, "fsck.ext4", "-fn", d.dev)
	d.detach()
	if state, _, _ := s.status().member(n.uris[lost]); state != "faulty" {
		t.Fatalf("member %d after its host was cut off under the copy: %q, want faulty", lost, state)
	}
	s.stop()

	s = n.serve(t, flags...)
	if st := s.status(); st.State != "degraded" || len(st.Missing) != 1 || st.Missing[0] != lost {
		t.Fatalf("restarted with member %d's host away: state %q, missing %v; want degraded, [%d]", lost, st.State, st.Missing, lost)
	}
	d = attachLoopIn(t, n.client.netPrefix(), s.uri)
	runTool(t, "fsck.ext4", "-fn", d.dev)
	mnt = d.mount(t)
	checkTree(t, mnt, sums)
	d.umount(t, mnt)
	d.detach()
	s.stop()
}

// TestNetnsCrashLoop is the crash loop (crashLoop: SIGKILL of raid5d under raid5d bench's
// logged writes, restart, bench --check, the resync only over the bitmap's regions, scrub
// check at the end) with every member on a host of its own and bench on the client host.
// RAID5D_CRASH_ROUNDS=20 runs it as long as TestCrashLoop.
func TestNetnsCrashLoop(t *testing.T) {
	crashLoop{rounds: 4, seed: 20261201, remote: true}.run(t)
}

// crashWithMemberDown leaves n's array as a power cut of its rack would: a region written and
// flushed before (pattern 0x5c at lateOff, verified afterwards), raid5d SIGKILLed under fio's
// writes (the array dirty, write-intent bits set), and member late's server stopped with it.
func (n *netArray) crashWithMemberDown(t *testing.T, late int) []qemuOp {
	t.Helper()
	const lateOff, lateLen = 128 << 20, 1 << 20 // beyond verify.fio's [0, 64M)
	s := n.serve(t, "--member-timeout", netTimeout.String())
	qemuIOIn(t, n.client.prefix(), s.uri, []qemuOp{{kind: "write", off: lateOff, n: lateLen, pattern: 0x5c}})
	s.stop() // flushed, clean
	s = n.serve(t, "--member-timeout", netTimeout.String())
	run := n.startLoad(t, s, "verify.fio")
	s.kill()
	<-run.done // fio fails with the daemon gone
	run.cancel()
	for _, m := range n.members {
		m.afterClientKilled(t)
	}
	if _, err := n.members[late].p.stop(syscall.SIGTERM, stopGrace); err != nil {
		t.Logf("nbdkit of member %d: %v", late, err)
	}
	return []qemuOp{{kind: "read", off: lateOff, n: lateLen, pattern: 0x5c}}
}

// TestNetnsLateMember: after a power cut of the rack (crashWithMemberDown), raid5d starts
// before a member host is back. /late: the member's server comes up a few seconds after the
// daemon; the daemon waits for it (--assemble-timeout), the array assembles whole — no member
// missing, no rebuild — resyncs the regions being written at the cut, and reads back what was
// written before; every stripe's parity matches on the member files. /never: the server does
// not come back; once --assemble-timeout has passed the daemon refuses the dirty array
// degraded, naming the member and the override, and writes nothing; --force serves it
// degraded with the write hole reported. /clean: the same host missing from an array stopped
// cleanly: served degraded once the wait has passed.
func TestNetnsLateMember(t *testing.T) {
	const late = 1 // an nbdkit host
	t.Run("late", func(t *testing.T) {
		need(t, "fio", "qemu-io")
		n := newNetArray(t, nil)
		reads := n.crashWithMemberDown(t, late)
		s, greet := n.lab.startServe(t, n.client, n.uris, "--member-timeout", netTimeout.String(), "--assemble-timeout", "2m")
		time.Sleep(3 * time.Second)
		if !s.running() {
			t.Fatalf("the daemon did not wait for the late member: %v\n%s", s.proc.err, s.proc.out.String())
		}
		n.members[late].start(t)
		s.awaitGreeting(greet)
		st := s.status()
		if len(st.Missing) != 0 || st.LastRebuild != nil || st.Sync != nil && st.Sync.Kind == "rebuild" {
			t.Fatalf("the late member: state %q, missing %v, sync %+v, last rebuild %+v; want every member, no rebuild", st.State, st.Missing, st.Sync, st.LastRebuild)
		}
		waitFor(t, "the resync of the regions written at the cut", 2*time.Minute, s.proc, func() bool {
			cs := s.crashStatus()
			return cs.LastResync != nil && cs.Sync == nil
		})
		if st := s.status(); st.State != "clean" && st.State != "active" || st.WriteHole {
			t.Fatalf("after the resync: state %q, write hole %v", st.State, st.WriteHole)
		}
		if !strings.Contains(s.proc.out.String(), "remote member answered") {
			t.Fatalf("the log does not say the late member answered:\n%s", s.proc.out.String())
		}
		qemuIOIn(t, n.client.prefix(), s.uri, reads, "-r")
		s.stop()
		checkParity(t, n.files())
	})
	t.Run("never", func(t *testing.T) {
		need(t, "fio", "qemu-io")
		n := newNetArray(t, nil)
		reads := n.crashWithMemberDown(t, late)
		var before [][32]byte
		for _, f := range n.files().members {
			before = append(before, fileSum(t, f))
		}
		start := time.Now()
		s, _ := n.lab.startServe(t, n.client, n.uris, "--member-timeout", netTimeout.String(), "--assemble-timeout", "2s")
		<-s.proc.exited
		s.stopped = true
		out := s.proc.out.String()
		if s.proc.err == nil || time.Since(start) < 2*time.Second ||
			!strings.Contains(out, "dirty array with a member missing") || !strings.Contains(out, n.uris[late]) || !strings.Contains(out, "--force") {
			t.Fatalf("dirty, member %d never came: exit %v after %v; want a refusal naming it and --force\n%s", late, s.proc.err, time.Since(start), out)
		}
		t.Logf("refused after %v:\n%s", time.Since(start).Round(time.Millisecond), out[strings.LastIndex(out, "raid: dirty array"):])
		for i, f := range n.files().members {
			if fileSum(t, f) != before[i] {
				t.Fatalf("the refused start wrote to member %d", i)
			}
		}
		s = n.lab.serve(t, n.client, n.uris, "--member-timeout", netTimeout.String(), "--assemble-timeout", "2s", "--force")
		if st := s.status(); st.State != "degraded" || !st.WriteHole || len(st.Missing) != 1 || st.Missing[0] != late {
			t.Fatalf("forced: state %q, write hole %v, missing %v", st.State, st.WriteHole, st.Missing)
		}
		qemuIOIn(t, n.client.prefix(), s.uri, reads, "-r")
		s.stop()
	})
	t.Run("clean", func(t *testing.T) {
		n := newNetArray(t, nil)
		if _, err := n.members[late].p.stop(syscall.SIGTERM, stopGrace); err != nil {
			t.Logf("nbdkit of member %d: %v", late, err)
		}
		s := n.serve(t, "--member-timeout", netTimeout.String(), "--assemble-timeout", "2s")
		if st := s.status(); st.State != "degraded" || st.WriteHole || len(st.Missing) != 1 || st.Missing[0] != late {
			t.Fatalf("clean, member %d never came: state %q, write hole %v, missing %v", late, st.State, st.WriteHole, st.Missing)
		}
		s.stop()
	})
	t.Run("re-add", func(t *testing.T) {
		// Served degraded, the member's server down; re-add is asked for before its server
		// is back (2 s later): the daemon tries it again until it answers, as assembly does
		// (one attempt before, refused at once). --stripe-cache SIZE reads nothing before
		// assembly.
		n := newNetArray(t, nil)
		if _, err := n.members[late].p.stop(syscall.SIGTERM, stopGrace); err != nil {
			t.Logf("nbdkit of member %d: %v", late, err)
		}
		s := n.serve(t, "--member-timeout", netTimeout.String(), "--assemble-timeout", "6s", "--stripe-cache", "16M")
		if st := s.status(); st.State != "degraded" || len(st.Missing) != 1 || st.Missing[0] != late {
			t.Fatalf("member %d down: state %q, missing %v", late, st.State, st.Missing)
		}
		type result struct {
			out  string
			err  error
			took time.Duration
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			out, err := runToolErr(raid5dBin, "re-add", "--control", s.control, n.uris[late])
			done <- result{out, err, time.Since(start)}
		}()
		time.Sleep(2 * time.Second)
		n.members[late].start(t)
		r := <-done
		if r.err != nil || r.took < 2*time.Second {
			t.Fatalf("re-add of a member whose server answers 2 s later: %v after %v\n%s", r.err, r.took, r.out)
		}
		t.Logf("re-add answered after %v: %s", r.took.Round(time.Millisecond), strings.TrimSpace(r.out))
		s.waitStatus("the re-added member whole", time.Minute, (*r5Status).healthy)
		if !strings.Contains(s.proc.out.String(), "remote member answered") {
			t.Fatalf("the log does not say the late member answered:\n%s", s.proc.out.String())
		}
		s.stop()
		checkParity(t, n.files())
	})
}
