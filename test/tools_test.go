package test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// toolTimeout bounds every foreground tool run; a hung client fails its test instead of the package.
const toolTimeout = 3 * time.Minute

// requireTools reports whether RAID5D_REQUIRE_TOOLS=1: then a missing tool or privilege fails
// the test instead of skipping it.
func requireTools() bool { return os.Getenv("RAID5D_REQUIRE_TOOLS") == "1" }

// skipOrFail skips the test, or fails it when RAID5D_REQUIRE_TOOLS=1.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if requireTools() {
		t.Fatalf("RAID5D_REQUIRE_TOOLS=1 but "+format, args...)
	}
	t.Skipf(format, args...)
}

// need skips the test when one of tools is not on PATH (fails it under RAID5D_REQUIRE_TOOLS=1).
func need(t testing.TB, tools ...string) {
	t.Helper()
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		skipOrFail(t, "missing tools: %s (make deps installs them)", strings.Join(missing, ", "))
	}
}

// needRaid5d skips a raid5d-only test in stand-in mode.
func needRaid5d(t testing.TB) {
	t.Helper()
	if standin {
		t.Skip("raid5d-only check; RAID5D_E2E_STANDIN=nbdkit serves with nbdkit")
	}
}

// runTool runs a tool to completion and returns its stdout and stderr together; a non-zero exit
// fails the test with that output.
func runTool(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := runToolErr(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// prefixed is the command line of name with args run under prefix, a command that runs
// another (ip netns exec NS: on a lab's host): prefix's first word, then the rest of prefix,
// name and args. With no prefix, name and args.
func prefixed(prefix []string, name string, args ...string) (string, []string) {
	if len(prefix) == 0 {
		return name, args
	}
	return prefix[0], append(append(append([]string{}, prefix[1:]...), name), args...)
}

// runToolIn is runTool under prefix (see prefixed).
func runToolIn(t testing.TB, prefix []string, name string, args ...string) string {
	t.Helper()
	name, args = prefixed(prefix, name, args...)
	return runTool(t, name, args...)
}

// runToolErr runs a tool to completion (bounded by toolTimeout) and returns its combined output.
func runToolErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	return string(out), err
}

// lockedBuffer collects a child's output; safe for the copying goroutine and readers at once.
type lockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a background child process: its output goes to a buffer that is logged when the
// test fails, and it is stopped by PID (signal, then SIGKILL after a grace period).
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    lockedBuffer
	exited chan struct{} // closed when Wait returns
	err    error         // Wait's result; read only after exited is closed
}

// startProc starts name with args in the background. It registers a cleanup that logs the
// output when the test failed; stopping is up to the caller (see stop).
func startProc(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, nil, name, args...)
}

// startProcEnv is startProc with env (KEY=VALUE) added to the test's environment.
func startProcEnv(t testing.TB, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(name, args...)
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s %s (pid %d) output:\n%s", name, strings.Join(args, " "), p.cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// startProcIn is startProc under prefix (see prefixed): the process runs there, with the PID
// of the process started (ip netns exec execs the command).
func startProcIn(t testing.TB, prefix []string, name string, args ...string) *proc {
	t.Helper()
	name, args = prefixed(prefix, name, args...)
	return startProc(t, name, args...)
}

// running reports whether the process has not exited yet.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends sig to the process and waits up to grace for it to exit, then SIGKILLs it. It
// returns whether it had to be killed and Wait's error (nil for exit status 0). Safe to call
// after the process has exited on its own.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) (killed bool, err error) {
	if p.running() {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		killed = true
	}
	return killed, p.err
}

// waitFor polls cond every few milliseconds until it is true, the process p (if not nil) exits,
// or the deadline passes; it fails the test in the last two cases.
func waitFor(t testing.TB, what string, timeout time.Duration, p *proc, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if p != nil && !p.running() {
			t.Fatalf("waiting for %s: %s exited: %v\n%s", what, p.name, p.err, p.out.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not there after %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
