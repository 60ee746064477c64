package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of one exchange.
const (
	maxRequest = 64 << 10         // bytes in one request line
	ioTimeout  = 10 * time.Second // to read a request and to write its response
	// ManageWait is the longest the daemon waits for a remote member that add, replace or
	// re-add names to answer (raid's maxManageWait): their clients wait for it too.
	ManageWait = 30 * time.Second
)

// Listen makes the control socket at path and listens on it. Its directory must not let anyone
// else replace the socket (ErrUnsafeDir). The socket is created under umask
// 0177 (so it is never, even briefly, open to others) and has permission 0600; a missing parent
// directory is created with 0700. A socket nobody answers on (left by a daemon that died) is
// removed first. It returns ErrDaemonRunning if a daemon answers at path, ErrNotSocket if path is
// something else.
//
// Listen changes the process umask for the duration of the bind: call it before starting
// goroutines that create files.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := checkDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// checkDir refuses a socket directory where someone else could replace the socket: one owned by
// another user (not root), or writable by group or others without the sticky bit.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s belongs to uid %d", ErrUnsafeDir, dir, st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("%w: %s is writable by others (mode %v)", ErrUnsafeDir, dir, fi.Mode())
	}
	return nil
}

// removeStale removes a unix socket at path that nothing answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%w: %s", ErrNotSocket, path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: %s", ErrDaemonRunning, path)
	}
	return os.Remove(path)
}

// Server answers management requests on a control socket.
type Server struct {
	// Array carries out fail, remove, add, replace, re-add, scrub and speed requests.
	Array Array
	// Status returns the array's status; every response carries it.
	Status func() Status
	// Classify maps an error from Array to one of this package's sentinels (for its wire code);
	// nil, or a nil result, means ErrFailed. The message sent is always the original's.
	Classify func(error) error
	// Logger logs each state-changing request and its outcome; nil logs nothing.
	Logger *slog.Logger
}

// Serve accepts connections on ln until ctx is done, then closes ln and returns after every
// connection has been answered. It returns nil after ctx is done, else the accept error.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			ln.Close()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			s.serveConn(c)
		}()
	}
}

func (s *Server) serveConn(c net.Conn) {
	c.SetDeadline(time.Now().Add(ioTimeout))
	if err := checkPeer(c); err != nil {
		s.log().Warn("control: connection refused", "error", err)
		json.NewEncoder(c).Encode(Response{Error: &ErrorReply{Code: "error", Message: err.Error()}})
		return
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, maxRequest), 4096).ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		return // the client went away or sent no complete line
	}
	var req Request
	var resp Response
	if err := json.Unmarshal(line, &req); err != nil {
		resp.Error = &ErrorReply{Code: codeOf(ErrBadRequest), Message: fmt.Sprintf("%v: %v", ErrBadRequest, err)}
	} else {
		resp = s.Handle(req)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	json.NewEncoder(c).Encode(resp)
}

// Handle carries out one request and returns its response; Serve calls it for every request.
func (s *Server) Handle(req Request) Response {
	err := req.validate()
	if err == nil {
		err = s.do(req)
		if req.Op != OpStatus {
			if err != nil {
				s.log().Warn("control: request refused", "op", req.Op, "member", req.Member, "path", req.Path,
					"action", req.Action, "force", req.Force, "error", err)
			} else {
				s.log().Info("control: request done", "op", req.Op, "member", req.Member, "path", req.Path,
					"action", req.Action, "min", req.Min, "max", req.Max, "force", req.Force)
			}
		}
	}
	if err != nil {
		code := "error"
		switch {
		case errors.Is(err, ErrBadRequest):
			code = codeOf(ErrBadRequest)
		default:
			code = codeOf(err)
			if s.Classify != nil {
				if e := s.Classify(err); e != nil {
					code = codeOf(e)
				}
			}
		}
		return Response{Error: &ErrorReply{Code: code, Message: err.Error()}}
	}
	st := s.Status()
	return Response{Status: &st}
}

func (s *Server) do(req Request) error {
	a := s.Array
	switch req.Op {
	case OpStatus:
		return nil
	case OpFail:
		return a.Fail(req.Member, req.Force)
	case OpRemove:
		return a.Remove(req.Member)
	case OpAdd:
		return a.AddSpare(req.Path, req.Force)
	case OpReplace:
		return a.Replace(req.Member, req.Path, req.Force)
	case OpReAdd:
		return a.ReAdd(req.Member)
	case OpScrub:
		if req.Action == ScrubStop {
			return a.StopScrub()
		}
		return a.StartScrub(req.Action == ScrubRepair)
	case OpSpeed:
		return a.SetSyncSpeed(req.Min, req.Max)
	}
	return fmt.Errorf("%w: unknown op %q", ErrBadRequest, req.Op)
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// checkPeer admits only root and the daemon's own user (the socket's permission already says
// so; this holds even if the socket was made accessible by hand).
func checkPeer(c net.Conn) error {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return credErr
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("control: uid %d may not manage this daemon (uid %d)", cred.Uid, os.Getuid())
	}
	return nil
}
