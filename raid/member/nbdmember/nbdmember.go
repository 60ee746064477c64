package nbdmember

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
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
	// Timeout is the deadline of every request, reconnecting included, and of Open's dial and
	// handshake (the array's member timeout). 0 means DefaultTimeout; < 0 none.
	Timeout time.Duration
	// Conns is how many connections to open to a server that advertises CAN_MULTI_CONN (one
	// otherwise): 0 means DefaultConns; at most MaxConns.
	Conns int
	// Logger receives reconnects, failures and the multi-connection fallback; nil means
	// slog.Default().
	Logger *slog.Logger
}

// DefaultConns is Options.Conns when zero, and MaxConns its largest value.
//
// One by measurement: raid5d over 4 nbdkit file exports on /dev/shm (unix sockets), fio's nbd
// engine, test/bench/member-conns.sh (RUNTIME=6 ROUNDS=5; medians, one run, a 2-core machine at
// load 14), MB/s with 1, 2 and 4 connections: seqwrite-1M (qd16) 371, 407, 349 (1.10×, 0.94×);
// randread-4k (qd32) 110, 79, 76 (0.72×, 0.69×); an earlier run (ROUNDS=3, RUNTIME=8):
// 385, 387, 322 and 87, 104, 74; with 5 ms added to every read and write (nbdkit's delay
// filter, RUNTIME=6 ROUNDS=3): 215, 183, 156 and 16, 16, 14. Again with a member's run of
// chunks as one request (RUNTIME=6 ROUNDS=3, load 8-10): 973, 813, 809 and 153, 156, 147; at
// 5 ms 879, 682, 872 and 20, 20, 22. No gain beyond the spread of the samples: one connection
// already carries up to client.DefaultMaxInFlight requests at once, and a server that works on
// them in parallel (nbdkit does) gains nothing from more; more connections cost goroutines and
// system calls. A server that serialises each connection's requests may gain: set Conns.
const (
	DefaultConns = 1
	MaxConns     = 16
)

// The errors of the kind. Open returns ErrUnreachable, ErrReadOnlyExport, ErrBlockSize and
// ErrTLSFiles (and client.ErrBadURI for a malformed URI); the I/O methods return *Error, which
// wraps ErrDeadline for a request that passed its deadline, and ErrLostWrites or
// ErrExportChanged once a break has failed the member.
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
	// ErrDeadline: a request had no reply within Options.Timeout (the connection was closed),
	// or could not be sent in that time because the connection could not be re-established.
	ErrDeadline = errors.New("nbdmember: request deadline passed")
	// ErrLostWrites: a connection broke when the server might have lost writes it had
	// acknowledged (none flushed since), or a write's reply was cut off; the member is failed
	// and every request from then on returns it (package doc, "Reconnecting").
	ErrLostWrites = errors.New("nbdmember: connection broke with writes not known to be durable; member failed")
	// ErrExportChanged: a connection of the member does not reach the member's export: after
	// a break the server announced the export differently (another size, a flag the member
	// uses gone, read-only, other block sizes), or a connection, of a reconnect or one of
	// those Open's first is joined by (SetRecheck), announced it differently or failed the
	// owner's recheck (not the same member: a server that came back with another disk behind
	// the URI, or that routes the member's connections to different disks). The member is
	// failed and every request from then on returns it; SetRecheck returns it too.
	ErrExportChanged = errors.New("nbdmember: a connection does not reach the member's export (changed, or routed elsewhere); member failed")
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
	}, OpenContext: func(ctx context.Context, spec string, use member.Use) (member.Member, error) {
		m, err := OpenContext(ctx, spec, use, opts())
		if err != nil {
			return nil, err
		}
		return m, nil
	}, MapPath: mapPaths}
	for _, p := range Prefixes {
		member.Register(p, k)
	}
}

// Member is an NBD export as an array member (package doc). It is safe for concurrent use.
type Member struct {
	name    string
	uri     client.URI
	copts   client.Options  // TLS settings: the same for every connection, reconnects too
	ctr     client.Counters // copts.Counters: every connection's, since Open
	use     member.Use
	size    int64
	flags   uint16 // the first handshake's; a reconnect must offer what is used of them (check)
	maxReq  int64  // the longest READ or WRITE sent: the server's maximum block size
	timeout time.Duration
	want    int // connections per generation once a recheck is set: Options.Conns if the server allows it
	log     *slog.Logger

	// nconns is how many connections a generation has (redial makes as many): 1 from Open
	// until SetRecheck has admitted more (up to want, as the server admits them).
	nconns atomic.Int64

	// cur is the generation of connections in use; once retired (a connection broke, or
	// Close), requests wait in await until another replaces it or the member has failed.
	cur atomic.Pointer[generation]

	// Counters for status and metrics (atomics, read with Load; the generation's connections
	// count their own requests in flight, conn.inflight).
	reconnects atomic.Int64                            // generations installed after Open's: successful reconnects
	recheck    atomic.Pointer[func(io.ReaderAt) error] // SetRecheck's, run on every connection before its use (admit)
	stats      stats                                   // every request's count and time, for Report (stats.go)

	setMu sync.Mutex // serialises SetRecheck's admission of the connections it checks and adds

	mu       sync.Mutex    // guards the fields below, and generation.retiring
	failed   error         // set once: every request fails with it (ErrLostWrites, ErrExportChanged)
	closed   bool          // Close was called
	dialing  bool          // a request is dialing the next generation (await)
	wake     chan struct{} // closed and replaced (signal) when any of these fields or cur changes
	backoff  time.Duration // the wait after the last failed dial before the next one
	nextDial time.Time     // no dial before then
	lastErr  error         // the last failed dial's error
	since    time.Time     // when cur was installed
	ctx      context.Context
	cancel   context.CancelFunc // ends the dials under way: Close
}

// generation is the set of connections the member uses between two breaks. A break of any
// of them (or a request past its deadline, which closes its connection) retires them all: see
// "Reconnecting" in the package doc for why.
type generation struct {
	// conns are the connections, never empty: Open's generation starts with one and gains the
	// others when the recheck is set (SetRecheck, under Member.mu while not retiring, so that
	// a break or Close that retires the generation sees every connection it must close).
	conns atomic.Pointer[[]*conn]

	active    atomic.Int64  // requests holding the generation (acquire to release)
	retired   atomic.Bool   // no new request may hold it
	drained   chan struct{} // closed once retired with active at 0
	drainOnce sync.Once

	// Writes for the break's verdict. acked counts WRITEs without FUA and WRITE_ZEROES the
	// server acknowledged; flushed is acked's value when the last FLUSH sent on every
	// connection began, once all of them succeeded; lost counts writes of any kind whose
	// reply the break cut off (the server may or may not apply them, and may do so late).
	acked, flushed, lost atomic.Int64

	retiring  bool          // guarded by Member.mu: a break (or Close) has retired it
	evaluated chan struct{} // closed once the break's verdict is in (Member.failed set, or not)
}

// conn is one connection of a generation.
type conn struct {
	c        *client.Conn
	nc       net.Conn     // the socket under c (under TLS too): closed at a deadline and at a break
	inflight atomic.Int64 // requests sent or about to be sent on it
	expired  atomic.Bool  // a request's deadline closed nc
}

func newGeneration(conns []*conn) *generation {
	g := &generation{drained: make(chan struct{}), evaluated: make(chan struct{})}
	g.conns.Store(&conns)
	return g
}

// list returns the connections of g.
func (g *generation) list() []*conn { return *g.conns.Load() }

var (
	_ member.DSyncWriter = (*Member)(nil)
	_ member.Vectored    = (*Member)(nil)
	_ member.Waiter      = (*Member)(nil)
)

// testHookMaskFlags clears transmission flags from every handshake, as a server that lacks
// them would (the tests of the multi-connection fallback use it).
var testHookMaskFlags uint16

// Open connects to the export spec names (an NBD URI, with libnbd's tls-certificates query
// key allowed on nbds URIs) and returns it as a member for use.
func Open(spec string, use member.Use, opts Options) (*Member, error) {
	return OpenContext(context.Background(), spec, use, opts)
}

// OpenContext is Open with the dial and handshake ending when ctx ends too (an
// ErrUnreachable then), besides Options.Timeout: raid.Assemble's attempts at a member that
// does not answer yet (member.Kind.OpenContext).
func OpenContext(ctx context.Context, spec string, use member.Use, opts Options) (*Member, error) {
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
	m := &Member{name: spec, uri: u, copts: copts, use: use, timeout: timeout, log: opts.Logger, wake: make(chan struct{})}
	m.copts.Counters = &m.ctr
	if m.log == nil {
		m.log = slog.Default()
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	cancel := context.CancelFunc(func() {}) // no Close can end this dial: m is not returned yet
	if d := m.deadline(); !d.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, d)
	}
	defer cancel()
	c, err := m.dialConn(ctx)
	if err != nil {
		m.cancel()
		if unreachable(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, spec, err)
		}
		return nil, fmt.Errorf("nbdmember: %s: %w", spec, err)
	}
	size, _ := c.c.Size()
	minB, _, maxB := c.c.BlockSize()
	m.size, m.flags, m.maxReq = size, c.c.Flags()&^testHookMaskFlags, int64(maxB)
	switch {
	case use == member.Exclusive && m.flags&client.FlagReadOnly != 0:
		err = fmt.Errorf("%w: %s (opened read-write)", ErrReadOnlyExport, spec)
	case minB > maxMinBlock:
		err = fmt.Errorf("%w: %s asks for %d", ErrBlockSize, spec, minB)
	}
	if err != nil {
		m.cancel()
		c.c.Close()
		return nil, err
	}
	m.want = min(max(opts.Conns, 0), MaxConns)
	if m.want == 0 {
		m.want = DefaultConns
	}
	if m.want > 1 && m.flags&client.FlagCanMultiConn == 0 {
		m.log.Info("nbdmember: the server does not advertise CAN_MULTI_CONN: one connection", "member", spec, "member-conns", m.want)
		m.want = 1
	}
	// The others are opened once the owner can tell whether they reach this export (SetRecheck).
	m.nconns.Store(1)
	m.cur.Store(newGeneration([]*conn{c}))
	m.since = time.Now()
	return m, nil
}

// errDial wraps a failure to reach the server's address (dialConn).
var errDial = errors.New("dial")

// unreachable reports whether Open's dial and handshake failed for want of a server that
// answers (ErrUnreachable): nothing listening (errDial), no answer in time (or before the
// caller gave up: OpenContext), no such export, or a connection reset or closed in the
// middle of the handshake, as by a server starting up or going down. A TLS or protocol
// failure is not: that server answered, wrongly.
func unreachable(err error) bool {
	var oe *client.OptionError
	return errors.As(err, &oe) && oe.Reply == repErrUnknown || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, errDial) ||
		errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// dialConn makes one connection and runs the handshake, within ctx.
func (m *Member) dialConn(ctx context.Context) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, m.uri.Network, m.uri.Address)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDial, err)
	}
	c, err := client.NewConn(ctx, nc, m.uri.Export, m.copts)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &conn{c: c, nc: nc}, nil
}

// admit returns nil if c, a connection not yet in use, reaches the member's export: it
// announces the export as Open's first handshake did (check; extra: it is not the first of
// its generation) and passes the owner's recheck (recheckExport), bounded by ctx. Every
// connection is admitted before it carries a request, but for Open's first: the owner
// identifies the export through it, and SetRecheck admits it then (see the package doc).
// ErrExportChanged says c reaches something else (the member must fail); another error, that
// c could not be checked.
func (m *Member) admit(ctx context.Context, c *conn, extra bool) error {
	if err := m.check(c.c, extra); err != nil {
		return err
	}
	return m.recheckExport(ctx, c)
}

// moreConns dials connections until there are n with the have of the generation they join,
// as the server admits them, each admitted (admit) before it is returned: a server may route
// a URI's connections to different disks. None are dialed while no recheck is set, since
// nothing could tell whether they reach the export. It stops at the first dial the server
// refuses or that cannot be checked (the generation has fewer connections), and fails, with
// none returned, when one reaches another export (ErrExportChanged).
func (m *Member) moreConns(ctx context.Context, have, n int) ([]*conn, error) {
	if m.recheck.Load() == nil {
		return nil, nil
	}
	var more []*conn
	for have+len(more) < n {
		c, err := m.dialConn(ctx)
		if err == nil {
			if err = m.admit(ctx, c, true); err != nil {
				c.c.Close()
			}
		}
		if errors.Is(err, ErrExportChanged) {
			closeConns(more)
			return nil, err
		}
		if err != nil {
			m.log.Debug("nbdmember: extra connection refused", "member", m.name, "err", err)
			break
		}
		more = append(more, c)
	}
	return more, nil
}

// closeConns closes conns, which carry no requests.
func closeConns(conns []*conn) {
	for _, c := range conns {
		c.c.Close()
	}
}

// check returns ErrExportChanged unless c announces the export as Open's first handshake did:
// the same size, every flag the member uses still offered (CAN_MULTI_CONN too on a
// generation of several: extra, or nconns above one), not read-only if it writes, and block
// sizes its requests still fit.
func (m *Member) check(c *client.Conn, extra bool) error {
	size, _ := c.Size()
	flags := c.Flags() &^ testHookMaskFlags
	minB, _, maxB := c.BlockSize()
	used := m.flags & (client.FlagSendFlush | client.FlagSendFUA | client.FlagSendWriteZeroes)
	if extra || m.nconns.Load() > 1 {
		used |= m.flags & client.FlagCanMultiConn
	}
	switch {
	case size != m.size:
		return fmt.Errorf("%w: %s: size %d, was %d", ErrExportChanged, m.name, size, m.size)
	case flags&used != used:
		return fmt.Errorf("%w: %s: transmission flags %#x lack %#x", ErrExportChanged, m.name, flags, used&^flags)
	case m.use == member.Exclusive && flags&client.FlagReadOnly != 0:
		return fmt.Errorf("%w: %s: now read-only", ErrExportChanged, m.name)
	case minB > maxMinBlock || int64(maxB) < m.maxReq:
		return fmt.Errorf("%w: %s: block sizes min %d max %d, were max %d", ErrExportChanged, m.name, minB, maxB, m.maxReq)
	}
	return nil
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

// Waits (member.Waiter) is true: every request is at least a round trip to the server.
func (m *Member) Waits() bool { return true }

// Close disconnects (DISC) and closes the connections; requests waiting for a reconnect fail.
func (m *Member) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.cancel()
	g := m.cur.Load()
	live := !g.retiring
	g.retiring = true
	m.signal()
	m.mu.Unlock()
	if !live {
		return nil // a break retired it: its verdict closes the connections
	}
	g.retired.Store(true)
	var err error
	for _, c := range g.list() {
		broken := c.c.Err() != nil
		// DISC to a server that stopped reading must not hang Close.
		c.nc.SetWriteDeadline(time.Now().Add(closeTimeout))
		if e := c.c.Close(); e != nil && !broken && err == nil {
			err = e
		}
	}
	close(g.evaluated)
	return err
}

// closeTimeout bounds Close's DISC on each connection.
const closeTimeout = 5 * time.Second

// kind is what a request is, for its retry and the break's verdict.
type kind uint8

const (
	kRead     kind = iota
	kWrite         // WRITE: in the server's cache until a FLUSH
	kWriteFUA      // WRITE with FUA: durable when acknowledged
	kZeroes        // WRITE_ZEROES: as kWrite
)

// ReadAt reads len(p) bytes at off: the full length or an *Error.
func (m *Member) ReadAt(p []byte, off int64) (int, error) {
	return m.data(kRead, p, off)
}

// WriteAt writes p at off; durable after Sync.
func (m *Member) WriteAt(p []byte, off int64) (int, error) {
	return m.data(kWrite, p, off)
}

// WriteAtDSync writes p at off durably: with FUA where the server advertises it, else a WRITE
// and a FLUSH.
func (m *Member) WriteAtDSync(p []byte, off int64) (int, error) {
	if m.flags&client.FlagSendFUA != 0 {
		return m.data(kWriteFUA, p, off)
	}
	n, err := m.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	return n, m.Sync()
}

// data runs a READ or WRITE of p at off, in requests of at most the server's maximum block
// size.
func (m *Member) data(k kind, p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		c := min(int64(len(p)-n), m.maxReq)
		if err := m.do(k, p[n:n+int(c)], nil, off+int64(n), c); err != nil {
			return n, err
		}
		n += int(c)
	}
	return n, nil
}

// ReadvAt (member.Vectored) reads bufs from consecutive offsets from off: runs of buffers
// one after another in one READ each, up to the server's maximum block size (a buffer longer
// than that split as ReadAt splits it), all in flight at once, so that a member's chunks cost
// one request and one round trip, not one each. The full length or an error.
func (m *Member) ReadvAt(bufs [][]byte, off int64, _ []unix.Iovec) (int, error) {
	return m.vectored(kRead, bufs, off)
}

// WritevAt (member.Vectored) writes bufs to consecutive offsets from off, as ReadvAt reads.
func (m *Member) WritevAt(bufs [][]byte, off int64, _ []unix.Iovec) (int, error) {
	return m.vectored(kWrite, bufs, off)
}

// vectored sends bufs as runs of buffers, one request each (vecRuns), all at once, and
// returns the bytes of the requests before the first that failed, with its error.
func (m *Member) vectored(k kind, bufs [][]byte, off int64) (int, error) {
	if len(bufs) == 1 {
		return m.data(k, bufs[0], off)
	}
	runs := vecRuns(bufs, m.maxReq)
	run := func(i int, at int64) error {
		r := bufs[runs[i]:runs[i+1]]
		if len(r) == 1 {
			_, err := m.data(k, r[0], at)
			return err
		}
		return m.do(k, nil, r, at, int64(buffersLen(r)))
	}
	if len(runs) == 2 {
		if err := run(0, off); err != nil {
			return 0, err
		}
		return buffersLen(bufs), nil
	}
	errs := make([]error, len(runs)-1)
	var wg sync.WaitGroup
	at := off
	for i := range len(runs) - 1 {
		wg.Add(1)
		go func(at int64) {
			defer wg.Done()
			errs[i] = run(i, at)
		}(at)
		at += int64(buffersLen(bufs[runs[i]:runs[i+1]]))
	}
	wg.Wait() // the buffers are the caller's again only once every request has returned
	n := 0
	for i, err := range errs {
		if err != nil {
			return n, err
		}
		n += buffersLen(bufs[runs[i]:runs[i+1]])
	}
	return n, nil
}

// vecRuns cuts bufs into runs of buffers of at most max bytes together (a longer buffer is a
// run alone): run i is bufs[runs[i]:runs[i+1]].
func vecRuns(bufs [][]byte, max int64) []int {
	runs := []int{0}
	var n int64
	for i, b := range bufs {
		if i > runs[len(runs)-1] && n+int64(len(b)) > max {
			runs = append(runs, i)
			n = 0
		}
		n += int64(len(b))
	}
	return append(runs, len(bufs))
}

func buffersLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
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
		if err := m.do(kZeroes, nil, nil, off, k); err != nil {
			return err
		}
		off, length = off+k, length-k
	}
	return nil
}

// deadline is the deadline of a request starting now (zero: none).
func (m *Member) deadline() time.Time {
	if m.timeout <= 0 {
		return time.Time{}
	}
	return time.Now().Add(m.timeout)
}

// do runs one request of n bytes at off (p: a READ's destination, a WRITE's payload; or, for
// kRead and kWrite, bufs, one after another) under its deadline, on the connection acquire
// gives. Past the deadline the connection is closed, which makes the request (and every
// other in flight on it) return. A read cut off by a
// break is sent again once reconnected, and so is any request the break kept from being
// sent (client.ErrNotSent); a write the break cut off is not (see the package doc,
// "Reconnecting"): it fails, and so does the member.
func (m *Member) do(k kind, p []byte, bufs [][]byte, off, n int64) (err error) {
	defer m.stats.end(m.stats.begin(), &err)
	deadline := m.deadline()
	for {
		g, c, err := m.acquire(deadline)
		if err != nil {
			return m.opError(k, off, n, err)
		}
		var t *time.Timer
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 { // spent reconnecting
				c.inflight.Add(-1)
				g.release()
				return m.opError(k, off, n, fmt.Errorf("%w (%v): reconnecting", ErrDeadline, m.timeout))
			}
			t = time.AfterFunc(left, c.expire)
		}
		switch {
		case k == kRead && bufs != nil:
			_, err = c.c.ReadvAt(bufs, off)
		case k == kRead:
			_, err = c.c.ReadAt(p, off)
		case k == kWrite && bufs != nil:
			_, err = c.c.WritevAt(bufs, off)
		case k == kWrite:
			_, err = c.c.WriteAt(p, off)
		case k == kWriteFUA:
			_, err = c.c.WriteAtFUA(p, off)
		case k == kZeroes:
			err = c.c.WriteZeroes(off, n, false)
		}
		fired := t != nil && !t.Stop()
		broken := errors.Is(err, client.ErrDisconnected)
		retry := broken && (k == kRead || errors.Is(err, client.ErrNotSent))
		switch {
		case err == nil && (k == kWrite || k == kZeroes):
			g.acked.Add(1)
		case broken && !retry:
			g.lost.Add(1) // before release: the verdict counts it
		}
		c.inflight.Add(-1)
		g.release()
		if err == nil {
			return nil
		}
		if !broken {
			return m.opError(k, off, n, err) // the server's answer: the connection goes on
		}
		if fired {
			err = fmt.Errorf("%w (%v): %w", ErrDeadline, m.timeout, err)
		} else {
			err = m.brokenBy(c, err)
		}
		m.broke(g, err)
		if fired || !retry {
			return m.opError(k, off, n, err)
		}
	}
}

// opError is the *Error of a failed request.
func (m *Member) opError(k kind, off, n int64, err error) error {
	op := [...]string{kRead: "read", kWrite: "write", kWriteFUA: "write", kZeroes: "write-zeroes"}[k]
	return &Error{Op: op, Off: off, Len: n, Err: err}
}

// expire closes the connection of a request that passed its deadline.
func (c *conn) expire() {
	c.expired.Store(true)
	c.nc.Close()
}

// brokenBy is err, of a request on c that did not pass its own deadline, with ErrDeadline if
// another request's closed c.
func (m *Member) brokenBy(c *conn, err error) error {
	if c.expired.Load() {
		return fmt.Errorf("%w (another request's, %v): %w", ErrDeadline, m.timeout, err)
	}
	return err
}

// Sync flushes the server's cache (FLUSH on every connection); nil if the server advertises
// none. It succeeds only if every connection's FLUSH does, or if the connections broke with
// nothing acknowledged since the last flush (there was nothing to flush).
func (m *Member) Sync() (err error) {
	if m.flags&client.FlagSendFlush == 0 {
		return nil
	}
	defer m.stats.end(m.stats.begin(), &err)
	deadline := m.deadline()
	for {
		g := m.cur.Load()
		g.active.Add(1)
		if g.retired.Load() {
			g.release()
			// Every write acknowledged before this Sync was sent on g or on an earlier
			// generation, each of which broke with none unflushed, or the member failed.
			if err := m.settle(g, deadline); err != nil {
				return &Error{Op: "flush", Err: err}
			}
			if m.cur.Load() == g {
				return nil
			}
			continue // flush the generation that replaced it
		}
		if !deadline.IsZero() && time.Until(deadline) <= 0 { // spent reconnecting
			g.release()
			return &Error{Op: "flush", Err: fmt.Errorf("%w (%v): reconnecting", ErrDeadline, m.timeout)}
		}
		from := g.acked.Load() // every write counted has its reply: this FLUSH covers it
		fired, err := m.flushAll(g, deadline)
		g.release()
		if err == nil {
			for f := g.flushed.Load(); from > f && !g.flushed.CompareAndSwap(f, from); f = g.flushed.Load() {
			}
			return nil
		}
		if !errors.Is(err, client.ErrDisconnected) {
			return &Error{Op: "flush", Err: err}
		}
		if fired {
			err = fmt.Errorf("%w (%v): %w", ErrDeadline, m.timeout, err)
		}
		m.broke(g, err)
		if fired {
			return &Error{Op: "flush", Err: err}
		}
	}
}

// flushAll sends FLUSH on every connection of g, which the caller holds, at once, and returns
// whether a deadline closed a connection, and the first error (a deadline's first).
func (m *Member) flushAll(g *generation, deadline time.Time) (bool, error) {
	flush := func(c *conn) (bool, error) {
		c.inflight.Add(1)
		defer c.inflight.Add(-1)
		var t *time.Timer
		if !deadline.IsZero() {
			t = time.AfterFunc(time.Until(deadline), c.expire)
		}
		err := c.c.Flush()
		return t != nil && !t.Stop(), err
	}
	conns := g.list()
	if len(conns) == 1 {
		return flush(conns[0])
	}
	errs := make([]error, len(conns))
	fired := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns[1:] {
		wg.Go(func() { fired[i+1], errs[i+1] = flush(c) })
	}
	fired[0], errs[0] = flush(conns[0])
	wg.Wait()
	var err error
	for i := range errs {
		if errs[i] != nil && (err == nil || fired[i]) {
			err = errs[i]
		}
	}
	return slices.Contains(fired, true), err
}

// acquire returns the generation to send a request on, held (release it), and the
// connection of it with the fewest requests in flight, counted in its inflight (the caller
// takes it off). A retired generation is waited out (await), within deadline.
func (m *Member) acquire(deadline time.Time) (*generation, *conn, error) {
	for {
		g := m.cur.Load()
		g.active.Add(1)
		if !g.retired.Load() {
			c := g.pick()
			if err := c.c.Err(); err != nil { // broken while nobody was sending
				c.inflight.Add(-1)
				g.release()
				m.broke(g, m.brokenBy(c, err))
				continue
			}
			return g, c, nil
		}
		g.release()
		if err := m.await(g, deadline); err != nil {
			return nil, nil, err
		}
	}
}

// pick counts a request in the inflight of the connection of g with the fewest, and returns
// it. The count is taken by compare-and-swap from the value seen to be the least, so that
// requests picking at once spread as if they had picked one after the other.
func (g *generation) pick() *conn {
	conns := g.list()
	if len(conns) == 1 {
		conns[0].inflight.Add(1)
		return conns[0]
	}
	for {
		c := conns[0]
		v := c.inflight.Load()
		for _, o := range conns[1:] {
			if w := o.inflight.Load(); w < v {
				c, v = o, w
			}
		}
		if c.inflight.CompareAndSwap(v, v+1) {
			return c
		}
	}
}

// release lets go of a generation acquire returned.
func (g *generation) release() {
	if g.active.Add(-1) == 0 && g.retired.Load() {
		g.drainOnce.Do(func() { close(g.drained) })
	}
}

// broke retires g, on which a request saw its connection break (cause), and returns once the
// break's verdict is in. The caller must not hold g. The first caller closes every
// connection of g, waits for the requests holding it to return, and decides (verdict)
// whether the member may reconnect or has failed; the others wait for that.
func (m *Member) broke(g *generation, cause error) {
	m.mu.Lock()
	if g.retiring {
		m.mu.Unlock()
		<-g.evaluated
		return
	}
	g.retiring = true
	m.mu.Unlock()
	g.retired.Store(true)
	conns := g.list() // all of them: none is added once retiring is set
	for _, c := range conns {
		c.nc.Close() // every request in flight returns
	}
	if g.active.Load() == 0 {
		g.drainOnce.Do(func() { close(g.drained) })
	}
	<-g.drained
	closeConns(conns) // the reply readers end (their sockets are closed: no DISC is sent)
	err := m.verdict(g, cause)
	m.mu.Lock()
	switch {
	case err != nil && m.failed == nil:
		m.failed = err
		m.log.Error("nbdmember: connection broken, member failed", "member", m.name, "err", err)
	case err == nil && !m.closed && m.failed == nil:
		m.log.Warn("nbdmember: connection broken, reconnecting", "member", m.name, "err", cause)
	}
	// The first dial comes at once after a generation that lasted, with backoff after one
	// that broke soon after it was made (a server that accepts and drops, a flapping link).
	if time.Since(m.since) > 2*maxBackoff {
		m.backoff, m.nextDial = 0, time.Time{}
	} else {
		m.backoff = min(max(2*m.backoff, minBackoff), maxBackoff)
		m.nextDial = time.Now().Add(m.backoff)
	}
	close(g.evaluated)
	m.signal()
	m.mu.Unlock()
}

// verdict decides, once every request of g has returned, whether the member may go on with
// new connections after g's break: not if a write's reply was cut off, or if a write was
// acknowledged since the last FLUSH that covered it and the server has a cache to flush.
func (m *Member) verdict(g *generation, cause error) error {
	if n := g.lost.Load(); n > 0 {
		return fmt.Errorf("%w: %s: %d writes in flight when the connection broke: %w", ErrLostWrites, m.name, n, cause)
	}
	if n := g.acked.Load() - g.flushed.Load(); n > 0 && m.flags&client.FlagSendFlush != 0 {
		return fmt.Errorf("%w: %s: %d writes acknowledged since the last FLUSH: %w", ErrLostWrites, m.name, n, cause)
	}
	return nil
}

// settle waits, within deadline, for the verdict on the retired g, and returns the member's
// failure if any.
func (m *Member) settle(g *generation, deadline time.Time) error {
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-g.evaluated:
		case <-t.C:
			return fmt.Errorf("%w (%v): waiting for a broken connection to close", ErrDeadline, m.timeout)
		}
	} else {
		<-g.evaluated
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unusable()
}

// unusable is the error of a request to a failed or closed member, else nil. m.mu is held.
func (m *Member) unusable() error {
	switch {
	case m.failed != nil:
		return m.failed
	case m.closed:
		return errClosed
	}
	return nil
}

// errClosed is the error of a request after Close.
var errClosed = fmt.Errorf("%w: member closed", client.ErrDisconnected)

// await returns, within deadline, once a generation has replaced the retired g, dialing it
// itself when no other request is: with backoff (doubling from minBackoff to maxBackoff)
// while dials fail or connections break soon after they are made (broke). It returns the
// member's failure, ErrDeadline (with the last dial's error), or errClosed.
func (m *Member) await(g *generation, deadline time.Time) error {
	if err := m.settle(g, deadline); err != nil {
		return err
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if err := m.unusable(); err != nil {
			return err
		}
		if m.cur.Load() != g {
			return nil
		}
		wait := time.Until(m.nextDial)
		if !m.dialing && wait <= 0 {
			m.dialing = true
			m.mu.Unlock()
			ctx, cancel := m.dialContext(deadline)
			ng, err := m.redial(ctx)
			cancel()
			m.mu.Lock()
			m.dialing = false
			m.installed(ng, err)
			continue
		}
		var retry *time.Timer
		var retryC <-chan time.Time
		if !m.dialing {
			retry = time.NewTimer(wait)
			retryC = retry.C
		}
		w := m.wake
		m.mu.Unlock()
		select {
		case <-w:
		case <-retryC:
		case <-timeout:
			m.mu.Lock()
			if m.lastErr != nil {
				return fmt.Errorf("%w (%v): reconnecting: %w", ErrDeadline, m.timeout, m.lastErr)
			}
			return fmt.Errorf("%w (%v): reconnecting", ErrDeadline, m.timeout)
		}
		if retry != nil {
			retry.Stop()
		}
		m.mu.Lock()
	}
}

// Backoff between failed dials of a reconnect.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 1600 * time.Millisecond
)

// dialContext bounds a dial and handshake by deadline (none if zero) and Close.
func (m *Member) dialContext(deadline time.Time) (context.Context, context.CancelFunc) {
	if deadline.IsZero() {
		return context.WithCancel(m.ctx)
	}
	return context.WithDeadline(m.ctx, deadline)
}

// redial makes the next generation: as many connections as the last one was to have
// (nconns), each admitted (admit), the others as the server admits them (moreConns).
func (m *Member) redial(ctx context.Context) (*generation, error) {
	c, err := m.dialConn(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.admit(ctx, c, false); err != nil {
		c.c.Close()
		return nil, err
	}
	more, err := m.moreConns(ctx, 1, int(m.nconns.Load()))
	if err != nil {
		c.c.Close()
		return nil, err
	}
	return newGeneration(append([]*conn{c}, more...)), nil
}

// SetRecheck (member.Rechecker) sets the check every connection of the member must pass
// before it carries a request: the array's look at the export's superblock, so that neither
// a server that came back with another disk behind the same URI nor one that routes the
// member's connections to different disks is trusted. It runs the check at once on the
// connections in use (Open's: the owner calls it once the export carries what check looks
// for), then opens the others Options.Conns asks for, each admitted by the same check as a
// reconnection's. A connection that fails the check having read what it asked for fails the
// member, and SetRecheck returns an error wrapping ErrExportChanged; one whose read fails
// breaks the connections in use (a reconnect admits new ones) and is returned too. It may be
// called at any time; nil removes the check (and the connections beyond the first at the
// next reconnect).
func (m *Member) SetRecheck(check func(r io.ReaderAt) error) error {
	m.setMu.Lock()
	defer m.setMu.Unlock()
	if check == nil {
		m.recheck.Store(nil)
		m.nconns.Store(1)
		return nil
	}
	m.recheck.Store(&check)
	g := m.cur.Load()
	if g.retired.Load() {
		return nil // its replacement is admitted whole (redial)
	}
	ctx, cancel := m.dialContext(m.deadline())
	defer cancel()
	for _, c := range g.list() {
		if err := m.recheckExport(ctx, c); err != nil {
			return m.refuse(g, err)
		}
	}
	have := len(g.list())
	more, err := m.moreConns(ctx, have, m.want)
	if err != nil {
		return m.refuse(g, err)
	}
	if len(more) == 0 {
		return nil
	}
	if have+len(more) < m.want {
		m.log.Warn("nbdmember: the server refused more connections", "member", m.name, "conns", have+len(more), "member-conns", m.want)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if g.retiring {
		closeConns(more) // broken meanwhile: its replacement is admitted whole (redial)
		return nil
	}
	m.nconns.Store(int64(have + len(more)))
	conns := append(g.list()[:have:have], more...)
	g.conns.Store(&conns)
	return nil
}

// refuse retires g, whose connection err says could not be admitted (SetRecheck), failing
// the member if it reaches another export (ErrExportChanged), and returns err.
func (m *Member) refuse(g *generation, err error) error {
	if errors.Is(err, ErrExportChanged) {
		m.mu.Lock()
		if m.failed == nil {
			m.failed = err
			m.log.Error("nbdmember: a connection reaches another export, member failed", "member", m.name, "err", err)
		}
		m.mu.Unlock()
	}
	m.broke(g, err)
	return err
}

// recheckExport runs SetRecheck's check, if any, on c, bounded by ctx (which closes c's
// socket when it ends). A check that fails having read what it asked for is
// ErrExportChanged (the member fails); one whose read failed is only this dial's failure.
func (m *Member) recheckExport(ctx context.Context, c *conn) error {
	f := m.recheck.Load()
	if f == nil {
		return nil
	}
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	r := &recheckReader{c: c.c}
	err := (*f)(r)
	stop()
	switch {
	case err == nil:
		return nil
	case r.err != nil:
		return fmt.Errorf("nbdmember: reading the export to recheck it: %w", r.err)
	}
	return fmt.Errorf("%w: %s: %w", ErrExportChanged, m.name, err)
}

// recheckReader reads a reconnection for a recheck, keeping the first read error.
type recheckReader struct {
	c   *client.Conn
	err error
}

func (r *recheckReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.c.ReadAt(p, off)
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}

// installed records redial's result. m.mu is held.
func (m *Member) installed(g *generation, err error) {
	defer m.signal()
	switch {
	case err == nil && m.closed:
		closeConns(g.list())
	case err == nil:
		m.cur.Store(g)
		m.reconnects.Add(1)
		m.lastErr, m.since = nil, time.Now() // the backoff stays until g has lasted (broke)
		m.log.Info("nbdmember: reconnected", "member", m.name, "conns", len(g.list()))
	case errors.Is(err, ErrExportChanged):
		m.failed = err
		m.log.Error("nbdmember: the export changed, member failed", "member", m.name, "err", err)
	default:
		m.backoff = min(max(2*m.backoff, minBackoff), maxBackoff)
		m.nextDial, m.lastErr = time.Now().Add(m.backoff), err
		m.log.Debug("nbdmember: reconnect failed", "member", m.name, "err", err, "retry-in", m.backoff)
	}
}

// signal wakes every request waiting in await. m.mu is held.
func (m *Member) signal() {
	close(m.wake)
	m.wake = make(chan struct{})
}
