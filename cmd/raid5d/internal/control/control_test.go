package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// fakeArray records the calls it gets and answers with err (if set) or changes its status.
type fakeArray struct {
	mu    sync.Mutex // guards all below
	calls []string
	err   error
	st    Status
}

func (f *fakeArray) call(s string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
	if f.err != nil {
		return f.err
	}
	f.st.Events++
	return nil
}

func (f *fakeArray) Fail(m string, force bool) error { return f.call("fail " + m + forceWord(force)) }
func (f *fakeArray) Remove(m string) error           { return f.call("remove " + m) }
func (f *fakeArray) AddSpare(p string, force bool) error {
	return f.call("add " + p + forceWord(force))
}
func (f *fakeArray) Replace(m, p string, force bool) error {
	return f.call("replace " + m + " " + p + forceWord(force))
}
func (f *fakeArray) ReAdd(m string) error         { return f.call("re-add " + m) }
func (f *fakeArray) StartScrub(repair bool) error { return f.call(fmt.Sprint("scrub repair=", repair)) }
func (f *fakeArray) StopScrub() error             { return f.call("scrub stop") }
func (f *fakeArray) SetSyncSpeed(lo, hi int64) error {
	return f.call(fmt.Sprint("speed ", lo, " ", hi))
}

func forceWord(force bool) string {
	if force {
		return " --force"
	}
	return ""
}

func (f *fakeArray) status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

func (f *fakeArray) lastCall() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return ""
	}
	return f.calls[len(f.calls)-1]
}

// shortDir returns a directory for sockets: t.TempDir paths can pass the 108-byte limit.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startServer serves a fake array on a fresh socket until the test ends.
func startServer(t *testing.T, path string) (*fakeArray, *Server) {
	t.Helper()
	fake := &fakeArray{st: Status{UUID: "u", State: "active", Members: []MemberStatus{{Path: "/m0", Role: 0, State: StateActive}}}}
	srv := &Server{Array: fake, Status: fake.status}
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return fake, srv
}

func TestRoundTrips(t *testing.T) {
	sock := filepath.Join(shortDir(t), "c.sock")
	fake, _ := startServer(t, sock)
	for _, tc := range []struct {
		req  Request
		call string
	}{
		{Request{Op: OpStatus}, ""},
		{Request{Op: OpFail, Member: "2"}, "fail 2"},
		{Request{Op: OpFail, Member: "/dev/sdb"}, "fail /dev/sdb"},
		{Request{Op: OpFail, Member: "3", Force: true}, "fail 3 --force"},
		{Request{Op: OpAdd, Path: "/other", Force: true}, "add /other --force"},
		{Request{Op: OpReplace, Member: "1", Path: "/other", Force: true}, "replace 1 /other --force"},
		{Request{Op: OpRemove, Member: "/m1"}, "remove /m1"},
		{Request{Op: OpAdd, Path: "/spare"}, "add /spare"},
		{Request{Op: OpReplace, Member: "1", Path: "/new"}, "replace 1 /new"},
		{Request{Op: OpReAdd, Member: "/old"}, "re-add /old"},
		{Request{Op: OpScrub, Action: ScrubCheck}, "scrub repair=false"},
		{Request{Op: OpScrub, Action: ScrubRepair}, "scrub repair=true"},
		{Request{Op: OpScrub, Action: ScrubStop}, "scrub stop"},
		{Request{Op: OpSpeed, Min: 1 << 20, Max: 200 << 20}, fmt.Sprint("speed ", 1<<20, " ", 200<<20)},
		{Request{Op: OpSpeed, Max: 5 << 20}, fmt.Sprint("speed 0 ", 5<<20)},
	} {
		t.Run(tc.req.Op+"_"+tc.call, func(t *testing.T) {
			before := fake.status().Events
			st, err := Do(sock, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.call == "" {
				if st.Events != before {
					t.Errorf("status changed the array: events %d -> %d", before, st.Events)
				}
				return
			}
			if got := fake.lastCall(); got != tc.call {
				t.Errorf("array got %q, want %q", got, tc.call)
			}
			// The response carries the status after the request.
			if st.Events != before+1 || st.UUID != "u" || len(st.Members) != 1 {
				t.Errorf("status after %s: %+v (events before %d)", tc.req.Op, st, before)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	sock := filepath.Join(shortDir(t), "c.sock")
	fake, srv := startServer(t, sock)
	errOther := errors.New("raid: something specific")
	for _, tc := range []struct {
		name     string
		arrayErr error
		classify func(error) error
		req      Request
		want     error
	}{
		{"busy", fmt.Errorf("wrapped: %w", ErrBusy), nil, Request{Op: OpScrub, Action: ScrubCheck}, ErrBusy},
		{"no such member", ErrNoSuchMember, nil, Request{Op: OpFail, Member: "9"}, ErrNoSuchMember},
		{"not faulty", ErrNotFaulty, nil, Request{Op: OpRemove, Member: "0"}, ErrNotFaulty},
		{"array failed", ErrArrayFailed, nil, Request{Op: OpFail, Member: "1"}, ErrArrayFailed},
		{"degraded", ErrDegraded, nil, Request{Op: OpScrub, Action: ScrubRepair}, ErrDegraded},
		{"would fail", ErrWouldFail, nil, Request{Op: OpFail, Member: "3"}, ErrWouldFail},
		{"in use", ErrInUse, nil, Request{Op: OpAdd, Path: "/other"}, ErrInUse},
		{"not running", ErrNotRunning, nil, Request{Op: OpScrub, Action: ScrubStop}, ErrNotRunning},
		{"classified", errOther, func(error) error { return ErrBusy }, Request{Op: OpAdd, Path: "/x"}, ErrBusy},
		{"other", errOther, nil, Request{Op: OpAdd, Path: "/x"}, ErrFailed},
		{"unknown op", nil, nil, Request{Op: "explode"}, ErrBadRequest},
		{"fail without member", nil, nil, Request{Op: OpFail}, ErrBadRequest},
		{"replace without path", nil, nil, Request{Op: OpReplace, Member: "1"}, ErrBadRequest},
		{"bad scrub action", nil, nil, Request{Op: OpScrub, Action: "fix"}, ErrBadRequest},
		{"min above max", nil, nil, Request{Op: OpSpeed, Min: 10, Max: 5}, ErrBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake.mu.Lock()
			fake.err = tc.arrayErr
			fake.mu.Unlock()
			srv.Classify = tc.classify // no request is in flight between subtests
			st, err := Do(sock, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", st, err, tc.want)
			}
			var re *RemoteError
			if !errors.As(err, &re) {
				t.Fatalf("%T is not a *RemoteError", err)
			}
			if tc.arrayErr != nil && re.Message != tc.arrayErr.Error() {
				t.Errorf("message %q, want the array's %q", re.Message, tc.arrayErr.Error())
			}
		})
	}
	srv.Classify = nil
}

func TestMalformedRequest(t *testing.T) {
	sock := filepath.Join(shortDir(t), "c.sock")
	startServer(t, sock)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("{not json\n")); err != nil {
		t.Fatal(err)
	}
	var resp Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		t.Fatal(err)
	}
	if resp.Error == nil || resp.Error.Code != "bad-request" {
		t.Fatalf("response %+v, want a bad-request error", resp)
	}
}

func TestSocketPermission(t *testing.T) {
	dir := filepath.Join(shortDir(t), "sub") // created by Listen
	sock := filepath.Join(dir, "c.sock")
	old := syscall.Umask(0) // even with a permissive umask
	defer syscall.Umask(old)
	startServer(t, sock)
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket with permission 0600", fi.Mode())
	}
	di, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Errorf("created directory mode %v, want 0700", di.Mode().Perm())
	}
}

func TestSecondServerRefused(t *testing.T) {
	sock := filepath.Join(shortDir(t), "c.sock")
	startServer(t, sock)
	if ln, err := Listen(sock); !errors.Is(err, ErrDaemonRunning) {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("second Listen: %v, want ErrDaemonRunning", err)
	}
	// The first one still answers.
	if _, err := Do(sock, Request{Op: OpStatus}); err != nil {
		t.Fatalf("first server after the refused second: %v", err)
	}
}

func TestStaleSocketRemoved(t *testing.T) {
	sock := filepath.Join(shortDir(t), "c.sock")
	// A socket file nobody listens on, as a SIGKILLed daemon leaves it.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := Do(sock, Request{Op: OpStatus}); !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Do on a stale socket: %v, want ErrNoDaemon", err)
	}
	startServer(t, sock)
	if _, err := Do(sock, Request{Op: OpStatus}); err != nil {
		t.Fatalf("after replacing the stale socket: %v", err)
	}
}

func TestNotASocketRefused(t *testing.T) {
	path := filepath.Join(shortDir(t), "file")
	if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path); !errors.Is(err, ErrNotSocket) {
		t.Fatalf("Listen on a regular file: %v, want ErrNotSocket", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious" {
		t.Fatal("Listen touched the regular file")
	}
}

func TestNoDaemon(t *testing.T) {
	_, err := Do(filepath.Join(shortDir(t), "none.sock"), Request{Op: OpStatus})
	if !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Do with no socket: %v, want ErrNoDaemon", err)
	}
}

func TestStatusJSONRoundTrip(t *testing.T) {
	st := Status{
		UUID: "0123", State: "degraded", Events: 7, Size: 1 << 30, Level: 5, Disks: 4, Chunk: 64 << 10,
		Layout: "left-symmetric",
		Members: []MemberStatus{
			{Path: "/m0", Role: 0, State: StateActive, Events: 7, ReadErrors: 3},
			{Path: "/m1", Role: 1, State: StateFaulty, WriteErrors: 1},
			{Path: "/s", Role: 1, State: StateRebuilding},
			{Path: "/s2", Role: -1, State: StateSpare},
		},
		Missing:   []int{1},
		Sync:      &Progress{Kind: "rebuild", Role: 1, Done: 45, Total: 100, BytesPerSec: 1e6, ETASeconds: 12.5},
		LastScrub: &Progress{Kind: "check", Role: -1, Done: 100, Total: 100, Mismatches: 2, MismatchAt: []int64{3, 9}},
		Counters:  Counters{FullStripeWrites: 11, CacheStripes: 256},
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back Status
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, back) {
		t.Fatalf("round trip changed the status:\n%+v\n%+v", st, back)
	}
	for _, key := range []string{`"sync":`, `"mismatch_at":[3,9]`, `"read_errors":3`, `"full_stripe_writes":11`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s: %s", key, b)
		}
	}
}

func TestUnsafeDirRefused(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o700, true},
		{0o755, true},
		{0o777 | os.ModeSticky, true},
		{0o777, false},
		{0o770, false},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			dir := filepath.Join(shortDir(t), "d")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			ln, err := Listen(filepath.Join(dir, "c.sock"))
			if ln != nil {
				ln.Close()
			}
			if tc.ok && err != nil || !tc.ok && !errors.Is(err, ErrUnsafeDir) {
				t.Fatalf("Listen in a %v directory: %v", tc.mode, err)
			}
		})
	}
}
