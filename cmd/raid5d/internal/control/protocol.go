// Package control is the management endpoint of a running raid5d daemon: a unix socket
// (permission 0600) on which `raid5d status`, `fail`, `remove`, `add`, `replace`, `re-add`, `scrub` and
// `rebuild` talk to the daemon.
//
// # Protocol
//
// One request and one response per connection, each a single line of JSON. The client connects,
// writes a Request, and reads a Response; the server then closes the connection. Requests:
//
//	{"op":"status"}
//	{"op":"fail","member":"2"}            member: a path or a role number
//	{"op":"remove","member":"/dev/sdc"}
//	{"op":"add","path":"/dev/sde"}
//	{"op":"replace","member":"1","path":"/dev/sde"}
//	{"op":"re-add","member":"/dev/sdc"}      a failed member back, resyncing the bitmap's regions
//	{"op":"fail","member":"3","force":true} fail, add, replace: do it although it fails the
//	                                      array or overwrites another array's member
//	{"op":"scrub","action":"check"}       action: check, repair or stop
//	{"op":"speed","min":1048576,"max":0}  bytes/s, 0 leaves a bound unchanged
//
// Every response carries the status after the request was carried out ("status"), or an error
// ("error": {"code": "busy", "message": "..."}); the codes map to the sentinels below.
//
// # Concurrency
//
// The server handles each connection on its own goroutine; the Array it drives must allow
// concurrent calls. Serve returns only after every connection goroutine has finished.
package control

import (
	"errors"
	"fmt"
)

// Array is what the control server drives: the management methods of *raid.Array, with the
// same meanings; force is raid.Force (Request.Force).
type Array interface {
	Fail(member string, force bool) error
	Remove(member string) error
	AddSpare(path string, force bool) error
	Replace(member, path string, force bool) error
	ReAdd(member string) error
	StartScrub(repair bool) error
	StopScrub() error
	SetSyncSpeed(min, max int64) error
}

// Operations (Request.Op).
const (
	OpStatus  = "status"
	OpFail    = "fail"
	OpRemove  = "remove"
	OpAdd     = "add"
	OpReplace = "replace"
	OpReAdd   = "re-add"
	OpScrub   = "scrub"
	OpSpeed   = "speed"
)

// Scrub actions (Request.Action).
const (
	ScrubCheck  = "check"
	ScrubRepair = "repair"
	ScrubStop   = "stop"
)

// Request is one management request.
type Request struct {
	Op     string `json:"op"`
	Member string `json:"member,omitempty"` // fail, remove, replace, re-add: a path or a role number
	Path   string `json:"path,omitempty"`   // add, replace: the new member
	Action string `json:"action,omitempty"` // scrub: check, repair or stop
	Min    int64  `json:"min,omitempty"`    // speed: bytes/s, 0 = unchanged
	Max    int64  `json:"max,omitempty"`    // speed: bytes/s, 0 = unchanged
	// Force: fail, replace: even if the array fails (else ErrWouldFail); add, replace:
	// even over another array's superblock (else ErrInUse). mdadm's --force.
	Force bool `json:"force,omitempty"`
}

// Response is the answer to one Request: the status after it, or an error.
type Response struct {
	Status *Status     `json:"status,omitempty"`
	Error  *ErrorReply `json:"error,omitempty"`
}

// ErrorReply is an error as it travels on the wire.
type ErrorReply struct {
	Code    string `json:"code"` // one of the codes in the errors table, "error" for any other
	Message string `json:"message"`
}

// Errors a request can come back with. The client returns a *RemoteError that matches one of
// these with errors.Is (by its code) and carries the daemon's message.
var (
	// ErrBusy: a rebuild or scrub is running (scrub, replace), or the array cannot take the
	// request right now.
	ErrBusy = errors.New("control: busy")
	// ErrNoSuchMember: fail, remove or replace named no member of the array.
	ErrNoSuchMember = errors.New("control: no such member")
	// ErrNotFaulty: remove named a member that is neither faulty nor a spare.
	ErrNotFaulty = errors.New("control: member is not faulty")
	// ErrArrayFailed: the request would fail (or found failed) the array.
	ErrArrayFailed = errors.New("control: array failed")
	// ErrDegraded: the request needs every member (scrub).
	ErrDegraded = errors.New("control: array is degraded")
	// ErrWouldFail: fail or replace named a member whose loss would fail the array (a second
	// role without a working member, counting one being rebuilt); Force does it anyway.
	ErrWouldFail = errors.New("control: that would leave the array failed")
	// ErrInUse: add or replace named a path that carries another array's superblock or
	// journal; Force overwrites it.
	ErrInUse = errors.New("control: path belongs to another array")
	// ErrCannotReAdd: re-add named a member the write-intent bitmap cannot bring up to date
	// (another array's, a spare, its role held, its events older than the bitmap's last
	// clear, no bitmap); add rebuilds it fully.
	ErrCannotReAdd = errors.New("control: member cannot be re-added (add it: a full rebuild)")
	// ErrNotRunning: scrub stop with no scrub running.
	ErrNotRunning = errors.New("control: no scrub is running")
	// ErrBadRequest: the request was malformed (unknown op, missing field, bad value).
	ErrBadRequest = errors.New("control: bad request")
	// ErrUnsupported: the daemon does not implement this request.
	ErrUnsupported = errors.New("control: not supported by this daemon")
	// ErrFailed: any other error the daemon reported; the message says what.
	ErrFailed = errors.New("control: request failed")
)

// codes is the wire name of each sentinel.
var codes = []struct {
	code string
	err  error
}{
	{"busy", ErrBusy},
	{"no-such-member", ErrNoSuchMember},
	{"not-faulty", ErrNotFaulty},
	{"array-failed", ErrArrayFailed},
	{"degraded", ErrDegraded},
	{"would-fail", ErrWouldFail},
	{"in-use", ErrInUse},
	{"cannot-re-add", ErrCannotReAdd},
	{"not-running", ErrNotRunning},
	{"bad-request", ErrBadRequest},
	{"unsupported", ErrUnsupported},
	{"error", ErrFailed},
}

func codeOf(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "error"
}

func errorOf(code string) error {
	for _, c := range codes {
		if c.code == code {
			return c.err
		}
	}
	return ErrFailed
}

// RemoteError is an error the daemon answered with. errors.Is matches the sentinel of its code.
type RemoteError struct {
	Code    string
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

// Is matches the sentinel named by the error's code.
func (e *RemoteError) Is(target error) bool { return errorOf(e.Code) == target }

// Errors of the client side.
var (
	// ErrNoDaemon is returned by Dial and Do when nothing answers at the socket (no such file,
	// or connection refused: a stale socket).
	ErrNoDaemon = errors.New("control: no daemon answers at the control socket")
	// ErrDaemonRunning is returned by Listen when another daemon answers at the socket path.
	ErrDaemonRunning = errors.New("control: another daemon answers at the control socket")
	// ErrUnsafeDir is returned by Listen when the socket's directory belongs to another user,
	// or others may write to it (and it is not sticky, as /tmp is).
	ErrUnsafeDir = errors.New("control: unsafe control socket directory")
	// ErrNotSocket is returned by Listen when the path exists and is not a unix socket.
	ErrNotSocket = errors.New("control: path exists and is not a socket")
)

// validate checks a request's fields for its op.
func (r *Request) validate() error {
	switch r.Op {
	case OpStatus:
	case OpFail, OpRemove, OpReAdd:
		if r.Member == "" {
			return fmt.Errorf("%w: %s needs a member", ErrBadRequest, r.Op)
		}
	case OpAdd:
		if r.Path == "" {
			return fmt.Errorf("%w: add needs a path", ErrBadRequest)
		}
	case OpReplace:
		if r.Member == "" || r.Path == "" {
			return fmt.Errorf("%w: replace needs a member and a path", ErrBadRequest)
		}
	case OpScrub:
		switch r.Action {
		case ScrubCheck, ScrubRepair, ScrubStop:
		default:
			return fmt.Errorf("%w: scrub action %q: want check, repair or stop", ErrBadRequest, r.Action)
		}
	case OpSpeed:
		if r.Min < 0 || r.Max < 0 || (r.Min > 0 && r.Max > 0 && r.Min > r.Max) {
			return fmt.Errorf("%w: speed min %d max %d: want 0 <= min <= max", ErrBadRequest, r.Min, r.Max)
		}
	default:
		return fmt.Errorf("%w: unknown op %q", ErrBadRequest, r.Op)
	}
	return nil
}
