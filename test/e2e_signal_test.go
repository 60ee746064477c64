package test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// secondSignalExit bounds how long the daemon may take to exit after the second signal.
const secondSignalExit = 10 * time.Second

// TestSecondSignal: the first SIGTERM makes the daemon drain, write out its stripe cache and
// mark the array clean; with every member hanging (the faulty: spec's delay, switched on after
// assembly) that write-out never ends. A second SIGTERM, or a SIGINT, must then end the
// process at once with exit status 128+signal and an ERROR line saying the array is left
// dirty, without touching the members: the superblocks still say dirty, the next start
// resyncs, and every byte flushed before the hang is there. Before, later signals were
// swallowed and only SIGKILL ended such a daemon.
func TestSecondSignal(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("raid5d's shutdown, not nbdkit's")
	}
	for _, tc := range []struct {
		name   string
		second syscall.Signal
	}{
		{"SIGTERM", syscall.SIGTERM},
		{"SIGINT", syscall.SIGINT},
	} {
		t.Run(tc.name, func(t *testing.T) { testSecondSignal(t, tc.second) })
	}
}

func testSecondSignal(t *testing.T, second syscall.Signal) {
	a := newArray(t)
	ctl := a.dir + "/hang"
	hung := &array{dir: a.dir}
	for _, m := range a.members {
		hung.members = append(hung.members, "faulty:"+m+"?delay=1h&ctl="+ctl)
	}
	// The cache keeps partial stripes for an hour, so the write-out happens at the stop;
	// --member-timeout keeps a deadline on member I/O from failing the hung members first.
	s := hung.serve(t, "--write-back-delay", "1h", "--member-timeout", "1h")
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Two full stripes, flushed: they must survive. Then a partial write into stripe 5,
	// acknowledged into the cache and written out only when the daemon stops.
	model := make([]byte, 2*stripeData)
	rng := rand.New(rand.NewPCG(uint64(second), 1))
	for i := range model {
		model[i] = byte(rng.Uint32())
	}
	if err := c.writeAt(model, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.writeAt(bytes.Repeat([]byte{0xa5}, 4096), 5*stripeData+chunkSize, false); err != nil {
		t.Fatal(err)
	}
	if _, dirty := offlineStatus(t, a); !dirty {
		t.Fatal("the superblocks of an array written to do not say dirty")
	}
	touch(t, ctl) // from now on every member read and write sleeps an hour

	s.stopped = true // the cleanup must not expect a clean exit
	logged := len(s.out.String())
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first signal's log line", 10*time.Second, s.proc, func() bool {
		return strings.Contains(s.out.String()[logged:], "a second SIGINT or SIGTERM exits at once")
	})
	time.Sleep(time.Second)
	if !s.running() {
		t.Fatalf("the daemon exited after one SIGTERM although its members hang: %v", s.err)
	}
	start := time.Now()
	killed, err := s.proc.stop(second, secondSignalExit)
	if killed {
		t.Fatalf("the daemon did not exit within %v of a second signal (%v); killed", secondSignalExit, second)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(second) {
		t.Fatalf("exit after the second signal (%v): %v, want exit status %d", second, err, 128+int(second))
	}
	t.Logf("exited %v after the second signal", time.Since(start).Round(time.Millisecond))
	found := false
	for _, r := range logRecords(t, s.out.String(), logged) {
		msg, _ := r["msg"].(string)
		if r["level"] == "ERROR" && strings.Contains(msg, "second signal") && strings.Contains(msg, "left dirty") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no ERROR line saying the second signal leaves the array dirty:\n%s", s.out.String()[logged:])
	}

	// The superblocks still say dirty; the next start resyncs and every flushed byte is there.
	if state, dirty := offlineStatus(t, a); !dirty {
		t.Fatalf("after the exit on a second signal the superblocks say clean (state %s), want dirty", state)
	}
	r := a.serve(t)
	var st *crashStatus
	waitFor(t, "the resync after the restart", 60*time.Second, r.proc, func() bool {
		st = r.crashStatus()
		return st.LastResync != nil && (st.Sync == nil || st.Sync.Kind != "resync")
	})
	if st.LastResync.Kind != "resync" || st.LastResync.Err != "" || st.LastResync.Done != st.LastResync.Total {
		t.Fatalf("the resync after the restart: %+v, want finished", *st.LastResync)
	}
	rc, err := wireConnect(r.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := rc.readAt(0, uint32(len(model)))
	if err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("flushed data differs at byte %d after the exit on a second signal and the restart", i)
	}
	r.stop()
	checkParity(t, a)
}
