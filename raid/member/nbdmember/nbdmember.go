package nbdmember

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/raid/member"
)

// Prefixes are the spec prefixes of the kind.
var Prefixes = []string{"nbd://", "nbds://", "nbd+unix://", "nbds+unix://"}

// DefaultTimeout is Options.Timeout when zero: raid.DefaultMemberTimeout.
const DefaultTimeout = 30 * time.Second

// maxMinBlock is the largest minimum block size an export may ask for: the array reads and
// writes members in multiples of 4 KiB at 4 KiB offsets.
const maxMinBlock = 4096

// Options of the kind, bound in by Register.
type Options struct {
	// TLSCA, TLSCert and TLSKey are PEM files for nbds members whose URI has no
	// tls-certificates key: the CAs that sign the servers' certificates (empty: the system's)
	// and a client certificate and key (both or neither).
	TLSCA, TLSCert, TLSKey string
	// Timeout is the deadline of every request and of the dial and handshake (the array's
	// member timeout). 0 means DefaultTimeout; < 0 none.
	Timeout time.Duration
}

// The errors of the kind. Open returns ErrUnreachable, ErrReadOnlyExport, ErrBlockSize and
// ErrTLSFiles (and client.ErrBadURI for a malformed URI); the I/O methods return *Error, which
// wraps ErrDeadline for a request that passed its deadline.
var (
	// ErrUnreachable: the export could not be reached (nothing listening, no such socket or
	// export, no answer within the timeout). It matches fs.ErrNotExist (errors.Is), so that
	// Assemble counts the member as missing.
	ErrUnreachable error = unreachableError{}
	// ErrReadOnlyExport: a read-only export opened read-write.
	ErrReadOnlyExport = errors.New("nbdmember: export is read-only")
	// ErrBlockSize: the export's minimum block size is above 4 KiB.
	ErrBlockSize = errors.New("nbdmember: export's minimum block size is above 4 KiB")
	// ErrTLSFiles: the TLS files named by tls-certificates or the options cannot be used.
	ErrTLSFiles = errors.New("nbdmember: TLS files")
	// ErrDeadline: a request had no reply within Options.Timeout; the connection was closed.
	ErrDeadline = errors.New("nbdmember: request deadline passed, connection closed")
)

type unreachableError struct{}

func (unreachableError) Error() string        { return "nbdmember: export unreachable" }
func (unreachableError) Is(target error) bool { return target == fs.ErrNotExist }

// Error is a failed request of a member: errno EIO to the array, with the cause inside.
type Error struct {
	Op       string // read, write, flush, write-zeroes
	Off, Len int64
	Err      error
}

func (e *Error) Error() string {
	if e.Op == "flush" {
		return fmt.Sprintf("nbdmember: flush: %v", e.Err)
	}
	return fmt.Sprintf("nbdmember: %s of %d bytes at %d: %v", e.Op, e.Len, e.Off, e.Err)
}
func (e *Error) Unwrap() error { return e.Err }
func (e *Error) Errno() uint32 { return uint32(unix.EIO) }

// Register registers the kind for Prefixes. opts is called at every Open, so that a command
// sets the options from its flags after it has parsed them (cmd/raid5d registers once, from
// init, for every command).
func Register(opts func() Options) {
	k := member.Kind{Open: func(spec string, use member.Use) (member.Member, error) {
		m, err := Open(spec, use, opts())
		if err != nil {
			return nil, err // not a nil *Member in a Member
		}
		return m, nil
	}}
	for _, p := range Prefixes {
		member.Register(p, k)
	}
}

// Member is an NBD export as an array member (package doc). It is safe for concurrent use.
type Member struct {
	name    string
	c       *client.Conn
	nc      net.Conn // the socket under c (under TLS too): closed when a request passes its deadline
	size    int64
	flags   uint16
	maxReq  int64 // the longest READ or WRITE sent: the server's maximum block size
	timeout time.Duration
	expired atomic.Bool // a request passed its deadline and closed the connection
}

var (
	_ member.DSyncWriter = (*Member)(nil)
	_ member.Vectored    = (*Member)(nil)
)

// Open connects to the export spec names (an NBD URI, with libnbd's tls-certificates query
// key allowed on nbds URIs) and returns it as a member for use.
func Open(spec string, use member.Use, opts Options) (*Member, error) {
	uri, tlsDir, err := splitTLSQuery(spec)
	if err != nil {
		return nil, err
	}
	u, err := client.ParseURI(uri)
	if err != nil {
		return nil, err
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	var copts client.Options
	if u.TLS {
		if copts.TLSConfig, err = tlsConfig(u, tlsDir, opts); err != nil {
			return nil, fmt.Errorf("%s: %w", spec, err)
		}
	} else if tlsDir != "" {
		return nil, fmt.Errorf("%w: %q: tls-certificates on a plaintext URI (use nbds:// or nbds+unix://)", client.ErrBadURI, spec)
	}
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, u.Network, u.Address)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, spec, err)
	}
	c, err := client.NewConn(ctx, nc, u.Export, copts)
	if err != nil {
		nc.Close()
		var oe *client.OptionError
		if errors.As(err, &oe) && oe.Reply == repErrUnknown || errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, spec, err)
		}
		return nil, fmt.Errorf("nbdmember: %s: %w", spec, err)
	}
	size, _ := c.Size()
	minB, _, maxB := c.BlockSize()
	m := &Member{name: spec, c: c, nc: nc, size: size, flags: c.Flags(), maxReq: int64(maxB), timeout: timeout}
	switch {
	case use == member.Exclusive && m.flags&client.FlagReadOnly != 0:
		err = fmt.Errorf("%w: %s (opened read-write)", ErrReadOnlyExport, spec)
	case minB > maxMinBlock:
		err = fmt.Errorf("%w: %s asks for %d", ErrBlockSize, spec, minB)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return m, nil
}

// repErrUnknown is NBD_REP_ERR_UNKNOWN: no such export.
const repErrUnknown = 1<<31 | 6

// splitTLSQuery takes libnbd's tls-certificates=DIR out of spec's query, which ParseURI does
// not accept, and returns the URI without it and DIR ("" if absent).
func splitTLSQuery(spec string) (uri, dir string, err error) {
	base, query, ok := strings.Cut(spec, "?")
	if !ok {
		return spec, "", nil
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", "", fmt.Errorf("%w: %q: %v", client.ErrBadURI, spec, err)
	}
	if v, ok := q["tls-certificates"]; ok {
		if len(v) != 1 || v[0] == "" {
			return "", "", fmt.Errorf("%w: %q: tls-certificates wants one DIR", client.ErrBadURI, spec)
		}
		dir = v[0]
		q.Del("tls-certificates")
	}
	if len(q) == 0 {
		return base, dir, nil
	}
	return base + "?" + q.Encode(), dir, nil
}

// tlsConfig is the client TLS configuration for an nbds URI: the files in dir (libnbd's
// layout) if given, else those of opts. The server name is the URI's host ("localhost" for a
// unix socket).
func tlsConfig(u client.URI, dir string, opts Options) (*tls.Config, error) {
	ca, cert, key := opts.TLSCA, opts.TLSCert, opts.TLSKey
	if dir != "" {
		ca, cert, key = filepath.Join(dir, "ca-cert.pem"), "", ""
		c, k := filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem")
		if _, err := os.Stat(c); err == nil {
			cert, key = c, k
		}
	}
	name := "localhost"
	if u.Network != "unix" {
		host, _, err := net.SplitHostPort(u.Address)
		if err != nil {
			host = u.Address
		}
		name = host
	}
	conf, err := client.LoadTLSConfig(ca, cert, key, name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTLSFiles, err)
	}
	return conf, nil
}

// Name is the URI the member was opened with.
func (m *Member) Name() string { return m.name }

// Size is the export's size as the server announced it.
func (m *Member) Size() int64 { return m.size }

// Close disconnects (DISC) and closes the connection.
func (m *Member) Close() error {
	if m.expired.Load() {
		m.c.Close()
		return nil
	}
	return m.c.Close()
}

// ReadAt reads len(p) bytes at off: the full length or an *Error.
func (m *Member) ReadAt(p []byte, off int64) (int, error) {
	return m.data("read", p, off, m.c.ReadAt)
}

// WriteAt writes p at off; durable after Sync.
func (m *Member) WriteAt(p []byte, off int64) (int, error) {
	return m.data("write", p, off, m.c.WriteAt)
}

// WriteAtDSync writes p at off durably: with FUA where the server advertises it, else a WRITE
// and a FLUSH.
func (m *Member) WriteAtDSync(p []byte, off int64) (int, error) {
	if m.flags&client.FlagSendFUA != 0 {
		return m.data("write", p, off, m.c.WriteAtFUA)
	}
	n, err := m.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	return n, m.Sync()
}

// data runs a READ or WRITE of p at off with f, in requests of at most the server's maximum
// block size.
func (m *Member) data(op string, p []byte, off int64, f func([]byte, int64) (int, error)) (int, error) {
	n := 0
	for n < len(p) {
		k := min(int64(len(p)-n), m.maxReq)
		q, at := p[n:n+int(k)], off+int64(n)
		if err := m.do(op, at, k, func() error { _, err := f(q, at); return err }); err != nil {
			return n, err
		}
		n += int(k)
	}
	return n, nil
}

// ReadvAt (member.Vectored) reads bufs from consecutive offsets from off with all their
// requests in flight at once (one per buffer, split as ReadAt splits), so that a member's
// chunks cost one round trip, not one each. The full length or an error.
func (m *Member) ReadvAt(bufs [][]byte, off int64, _ []unix.Iovec) (int, error) {
	return m.vectored("read", bufs, off, m.c.ReadAt)
}

// WritevAt (member.Vectored) writes bufs to consecutive offsets from off, as ReadvAt reads.
func (m *Member) WritevAt(bufs [][]byte, off int64, _ []unix.Iovec) (int, error) {
	return m.vectored("write", bufs, off, m.c.WriteAt)
}

// vectored runs data for each buffer of bufs at once and returns the bytes of the buffers
// before the first that failed, with its error.
func (m *Member) vectored(op string, bufs [][]byte, off int64, f func([]byte, int64) (int, error)) (int, error) {
	if len(bufs) == 1 {
		return m.data(op, bufs[0], off, f)
	}
	errs := make([]error, len(bufs))
	var wg sync.WaitGroup
	at := off
	for i, b := range bufs {
		wg.Add(1)
		go func(at int64) {
			defer wg.Done()
			_, errs[i] = m.data(op, b, at, f)
		}(at)
		at += int64(len(b))
	}
	wg.Wait() // the buffers are the caller's again only once every request has returned
	n := 0
	for i, b := range bufs {
		if errs[i] != nil {
			return n, errs[i]
		}
		n += len(b)
	}
	return n, nil
}

// Sync flushes the server's cache (FLUSH); nil if the server advertises none.
func (m *Member) Sync() error {
	if m.flags&client.FlagSendFlush == 0 {
		return nil
	}
	return m.do("flush", 0, 0, m.c.Flush)
}

// maxZeroes bounds one WRITE_ZEROES (the protocol's length is 32 bits).
const maxZeroes = 1 << 30

// Trim makes [off, off+length) read as zeroes: WRITE_ZEROES where advertised, else WRITEs of
// zeroes.
func (m *Member) Trim(off, length int64) error {
	if m.flags&client.FlagSendWriteZeroes == 0 {
		return member.WriteZeroes(m, off, length)
	}
	for length > 0 {
		k := min(length, maxZeroes)
		at := off
		if err := m.do("write-zeroes", at, k, func() error { return m.c.WriteZeroes(at, k, false) }); err != nil {
			return err
		}
		off, length = off+k, length-k
	}
	return nil
}

// do runs one request, f, under the deadline: past it the connection is closed, which makes f
// (and every other request in flight) return.
func (m *Member) do(op string, off, n int64, f func() error) error {
	var t *time.Timer
	if m.timeout > 0 {
		t = time.AfterFunc(m.timeout, m.expire)
	}
	err := f()
	fired := t != nil && !t.Stop()
	if err == nil {
		return nil
	}
	switch {
	case fired:
		err = fmt.Errorf("%w (%v): %w", ErrDeadline, m.timeout, err)
	case m.expired.Load() && errors.Is(err, client.ErrDisconnected):
		err = fmt.Errorf("%w (another request's): %w", ErrDeadline, err)
	}
	return &Error{Op: op, Off: off, Len: n, Err: err}
}

// expire closes the connection for a request that passed its deadline.
func (m *Member) expire() {
	m.expired.Store(true)
	m.nc.Close()
}
