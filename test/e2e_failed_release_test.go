package test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestFailedArrayLetsGo: with stable pages (serve's default) partial writes stay in the
// stripe cache by reference to the connection's request buffers until they are written out.
// When two members then fail, the array fails and nothing is written out again; the daemon
// must still give every buffer back: the client's DISC closes the connection, and SIGTERM ends
// the process in bounded time (the cleanup's stop fails the test after stopGrace). Before the
// fix, the connection waited for its buffers for ever ("device still holds pinned buffers").
func TestFailedArrayLetsGo(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	spec1, ctl := a.faultySpec(1, "wfail")
	spec2, _ := a.faultySpec(2, "wfail")
	s := a.withSpec(1, spec1).withSpec(2, spec2).serve(t, "--stable-pages", "--write-back-delay", "1h")
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One 4 KiB unit in each of 32 stripes: acknowledged, held in the cache by reference.
	for st := int64(0); st < 32; st++ {
		if err := c.writeAt(bytes.Repeat([]byte{byte(st)}, 4096), uint64(st*stripeData+chunkSize), false); err != nil {
			t.Fatal(err)
		}
	}
	touch(t, ctl) // members 1 and 2 now fail every write
	werr := c.writeAt(make([]byte, stripeData), 40*stripeData, true)
	if !errors.Is(werr, nbdErrno(syscall.EIO)) {
		t.Fatalf("write once two members fail: %v, want EIO", werr)
	}
	if st := s.status(); st.State != "failed" {
		t.Fatalf("array state %q after two failures, want failed", st.State)
	}
	if _, err := c.send(nbdCmdDisc, 0, 0, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitClosed(); err != nil {
		t.Fatalf("DISC to a failed array: %v", err)
	}
	// SIGTERM: the daemon exits within stopGrace, with status 1 and one line saying what was
	// lost (the unflushed writes in the cache), not one per stripe.
	s.stopped = true
	killed, err := s.proc.stop(syscall.SIGTERM, stopGrace)
	if killed {
		t.Fatalf("the daemon of a failed array did not exit within %v of SIGTERM", stopGrace)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit after SIGTERM on a failed array: %v, want exit status 1", err)
	}
	out := s.proc.out.String()
	if !strings.Contains(out, "acknowledged but not flushed") || strings.Count(out, "write-out of stripe") > 0 {
		t.Fatalf("the exit does not say in one line what was lost:\n%s", out)
	}
}
