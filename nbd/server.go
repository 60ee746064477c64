package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// Export is one device the server offers, under a name.
type Export struct {
	// Name is what clients ask for. The first export of Options.Exports is also the default
	// export, which clients reach with the empty name.
	Name string
	// Description is shown to a human by NBD_OPT_LIST and NBD_INFO_DESCRIPTION; may be empty.
	Description string
	// Device serves the export's bytes. Several exports may share one Device.
	Device Device
	// ReadOnly advertises NBD_FLAG_READ_ONLY and answers WRITE, TRIM and WRITE_ZEROES with EPERM.
	ReadOnly bool
	// MinBlock, PreferredBlock and MaxBlock are the size constraints advertised with
	// NBD_INFO_BLOCK_SIZE and enforced on requests (zero means DefaultMinBlock,
	// DefaultPreferredBlock, DefaultMaxBlock). MinBlock is a power of two up to 64 KiB;
	// PreferredBlock a power of two at least max(MinBlock, 512); MaxBlock a multiple of
	// MinBlock, at least PreferredBlock and at most 1 GiB. MaxBlock bounds the payload of one
	// READ or WRITE; TRIM and WRITE_ZEROES may be longer.
	MinBlock, PreferredBlock, MaxBlock uint32
	// StablePages hands WRITE payloads without FUA to the Device by reference, if it is a
	// PinnedWriter: the request buffer stays pinned and unchanged after the reply until the
	// device releases it, so the device may compute parity from it and write it out later
	// without copying. Its bytes stay charged to the connection's MaxInFlightBytes until then
	// (see "Concurrency and buffer ownership" in the package documentation). With StablePages
	// off, or a Device that is no PinnedWriter, writes go through WriteAt and the buffer is
	// reused once it returns.
	StablePages bool
	// MappedReads lets a Device that is a MappedReader answer READs with slices of its own
	// memory (a file's page cache mapped into memory) that the reply is written from, instead
	// of copying them into the request buffer first. Not over TLS: encryption would read the
	// slices in user space, which MappedReader rules out.
	MappedReads bool
	// AllowedClients and AllowedUIDs restrict the export to the clients they name; both empty
	// admit every client that got through the handshake so far. A client is admitted when the
	// subject CN or a DNS SAN of its verified TLS client certificate is in AllowedClients, or
	// it is a unix socket peer whose uid (SO_PEERCRED) is in AllowedUIDs. Others get
	// NBD_REP_ERR_POLICY to NBD_OPT_INFO and NBD_OPT_GO (NBD_REP_ERR_TLS_REQD if a certificate
	// could still admit them after STARTTLS), do not see the export in NBD_OPT_LIST, and are
	// disconnected after NBD_OPT_EXPORT_NAME (ErrAccessDenied); each refusal is logged.
	// AllowedClients needs TLS with verified client certificates (Options.TLSConfig with
	// ClientAuth RequireAndVerifyClientCert or VerifyClientCertIfGiven).
	AllowedClients []string
	AllowedUIDs    []int
}

// Options configure a Server.
type Options struct {
	// Exports are the devices served; at least one. Names must be unique, at most 4096 bytes.
	Exports []Export
	// Logger receives connection events and protocol violations; nil means slog.Default().
	Logger *slog.Logger
	// MaxInFlightBytes bounds the request buffers one connection holds at once (READ and WRITE
	// lengths of requests received but not yet replied to). A single request larger than the
	// bound is still served, alone. Zero means DefaultMaxInFlightBytes.
	MaxInFlightBytes int64
	// MaxInFlightRequests bounds the requests one connection processes concurrently; the
	// reader stops taking requests off the socket while it is reached. Zero means
	// DefaultMaxInFlightRequests.
	MaxInFlightRequests int
	// ShutdownTimeout bounds how long a connection may spend writing its last replies once
	// the context given to Serve is done (a client that stops reading cannot hold Serve
	// forever). It does not interrupt Device calls. Zero means 30 seconds.
	ShutdownTimeout time.Duration
	// MlockBuffers mlocks every request buffer, so the hot path never waits for a page to be
	// faulted in or swapped back. NewServer returns ErrMemlockLimit unless the process may lock
	// one connection's worth (MaxInFlightBytes plus the largest MaxBlock rounded up to a power
	// of two): RLIMIT_MEMLOCK that high, or CAP_IPC_LOCK. If more connections need more later,
	// the buffers that cannot be locked are used unlocked and a warning is logged once.
	MlockBuffers bool
	// DebugImmutable mprotects each buffer read-only while a PinnedWriter holds it (from
	// WritePinned until release), so any write to it, by the device or anyone else, faults. A
	// fault is a SIGSEGV that the Go runtime turns into a fatal error ("unexpected fault
	// address"), killing the process with a stack trace; that is the point. It costs two
	// mprotect calls per write; it has no effect without StablePages.
	DebugImmutable bool

	// TLSConfig enables NBD_OPT_STARTTLS with this configuration (a certificate at least; set
	// ClientCAs and ClientAuth for mutual TLS, or use LoadTLSConfig). The server uses a copy
	// with MinVersion raised to TLS 1.2 if it was lower.
	TLSConfig *tls.Config
	// TLSMode says whether TLS is off, offered or required; TLSDefault means TLSRequire when
	// TLSConfig is set, else TLSOff. TLSOn and TLSRequire need TLSConfig.
	TLSMode TLSMode

	// MaxConnections bounds the connections served at once, server-wide (every listener and
	// ServeConn call). One past it is closed at once, before the greeting, with a log line
	// (ErrTooManyConnections, at most one per second). Zero means DefaultMaxConnections.
	MaxConnections int
	// MaxTotalInFlightBytes bounds the request buffers of all connections together, on top of
	// each connection's MaxInFlightBytes: a reader whose READ or WRITE would exceed it waits
	// (logged at most once per second). A WRITE is charged as its payload arrives, 1 MiB
	// ahead, not in full when its header comes. While readers wait, a connection holding more
	// than its share (the bound divided by the connections being served) is served after
	// those holding less. A single request larger than the bound is served when nothing else
	// is in flight, and one payload at a time may pass the bound by up to its length, so that
	// payloads being received never wait for one another. Zero means
	// DefaultMaxTotalInFlightBytes.
	MaxTotalInFlightBytes int64
	// HandshakeTimeout bounds the handshake, from accepting the connection to the end of
	// option haggling, TLS included; a client that takes longer is dropped (ErrHandshakeTimeout).
	// Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// IdleTimeout, when positive, closes a connection in the transmission phase that has had
	// no request in flight and sent none for that long (ErrIdleTimeout). Zero means no limit.
	IdleTimeout time.Duration
	// ReplyTimeout bounds each reply write in the transmission phase (one writev of the
	// replies ready at that moment). A client that stops reading its socket makes the write
	// block once the socket buffers are full; after ReplyTimeout the connection is closed with
	// a log line (ErrReplyTimeout), and its requests' buffers return to the pool, instead of
	// staying charged to MaxInFlightBytes and MaxTotalInFlightBytes for as long as the client
	// keeps the socket open. Zero means DefaultReplyTimeout (30 s); there is no "never".
	ReplyTimeout time.Duration
	// PayloadTimeout bounds how long a WRITE's payload may take to arrive, from the first read
	// that waits for it (time the server spends waiting for MaxTotalInFlightBytes does not
	// count). It is a fixed bound, not reset as bytes arrive, so a client that trickles its
	// payload cannot hold its buffer for long either; the default asks for about 1 MiB/s of a
	// 32 MiB write. A payload not complete by then closes the connection with a log line
	// giving the bytes received of those expected (ErrPayloadTimeout), and the request's
	// buffer returns. Zero means DefaultPayloadTimeout (30 s); there is no "never".
	PayloadTimeout time.Duration
}

// Server serves exports over NBD. Create it with NewServer; it is safe for concurrent use, and
// Serve may run on several listeners at once.
type Server struct {
	exports          []Export // validated, defaults filled in; read-only after NewServer
	log              *slog.Logger
	maxInFlightBytes int64
	maxInFlightReqs  int
	shutdownTimeout  time.Duration
	mlock            bool        // Options.MlockBuffers
	debugImmutable   bool        // Options.DebugImmutable
	poolLimit        int64       // free buffer bytes one connection's pool keeps mapped
	tlsConfig        *tls.Config // nil when tlsMode is TLSOff
	tlsMode          TLSMode     // TLSOff, TLSOn or TLSRequire
	maxConns         int64
	handshakeTimeout time.Duration
	idleTimeout      time.Duration
	replyTimeout     time.Duration
	payloadTimeout   time.Duration

	conns       atomic.Int64 // connections being served (ServeConn calls past the limit check)
	mem         budget       // request bytes in flight, server-wide
	connsLog    rateLog      // MaxConnections hit
	memLog      rateLog      // MaxTotalInFlightBytes hit
	mlockWarned atomic.Bool  // a failed mlock has been logged
	bufStats    bufStats
}

// NewServer checks opts, fills in defaults and returns a server. It returns ErrNoExports,
// ErrInvalidExport or ErrInvalidOptions (wrapped with the detail) for a bad configuration, and
// ErrMemlockLimit when MlockBuffers cannot be honoured.
func NewServer(opts Options) (*Server, error) {
	if len(opts.Exports) == 0 {
		return nil, ErrNoExports
	}
	if opts.MaxInFlightBytes < 0 || opts.MaxInFlightRequests < 0 || opts.ShutdownTimeout < 0 ||
		opts.MaxConnections < 0 || opts.MaxTotalInFlightBytes < 0 || opts.HandshakeTimeout < 0 ||
		opts.IdleTimeout < 0 || opts.ReplyTimeout < 0 || opts.PayloadTimeout < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalidOptions)
	}
	s := &Server{
		exports:          make([]Export, len(opts.Exports)),
		log:              opts.Logger,
		maxInFlightBytes: opts.MaxInFlightBytes,
		maxInFlightReqs:  opts.MaxInFlightRequests,
		shutdownTimeout:  opts.ShutdownTimeout,
		mlock:            opts.MlockBuffers,
		debugImmutable:   opts.DebugImmutable,
		tlsMode:          opts.TLSMode,
		maxConns:         int64(opts.MaxConnections),
		handshakeTimeout: opts.HandshakeTimeout,
		idleTimeout:      opts.IdleTimeout,
		replyTimeout:     opts.ReplyTimeout,
		payloadTimeout:   opts.PayloadTimeout,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	switch s.tlsMode {
	case TLSDefault:
		s.tlsMode = TLSOff
		if opts.TLSConfig != nil {
			s.tlsMode = TLSRequire
		}
	case TLSOff:
	case TLSOn, TLSRequire:
		if opts.TLSConfig == nil {
			return nil, fmt.Errorf("%w: TLS mode %v without a TLSConfig", ErrInvalidOptions, s.tlsMode)
		}
	default:
		return nil, fmt.Errorf("%w: unknown %v", ErrInvalidOptions, s.tlsMode)
	}
	if s.tlsMode != TLSOff {
		s.tlsConfig = opts.TLSConfig.Clone()
		s.tlsConfig.MinVersion = max(s.tlsConfig.MinVersion, tls.VersionTLS12)
	}
	if s.maxConns == 0 {
		s.maxConns = DefaultMaxConnections
	}
	s.mem.max = opts.MaxTotalInFlightBytes
	if s.mem.max == 0 {
		s.mem.max = DefaultMaxTotalInFlightBytes
	}
	if s.handshakeTimeout == 0 {
		s.handshakeTimeout = DefaultHandshakeTimeout
	}
	if s.replyTimeout == 0 {
		s.replyTimeout = DefaultReplyTimeout
	}
	if s.payloadTimeout == 0 {
		s.payloadTimeout = DefaultPayloadTimeout
	}
	if s.maxInFlightBytes == 0 {
		s.maxInFlightBytes = DefaultMaxInFlightBytes
	}
	if s.maxInFlightReqs == 0 {
		s.maxInFlightReqs = DefaultMaxInFlightRequests
	}
	if s.shutdownTimeout == 0 {
		s.shutdownTimeout = 30 * time.Second
	}
	s.poolLimit = 2 * s.maxInFlightBytes // size classes round up to twice the bytes in flight
	seen := make(map[string]bool)
	for i, e := range opts.Exports {
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("%w: export %d (%q): %v", ErrInvalidExport, i, e.Name, err)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("%w: duplicate name %q", ErrInvalidExport, e.Name)
		}
		seen[e.Name] = true
		if len(e.AllowedClients) > 0 && (s.tlsMode == TLSOff || !verifiesClients(s.tlsConfig)) {
			return nil, fmt.Errorf("%w: export %q has AllowedClients but the server does not "+
				"verify client certificates (TLS off, or TLSConfig.ClientAuth below "+
				"VerifyClientCertIfGiven)", ErrInvalidExport, e.Name)
		}
		s.exports[i] = e
		s.exports[i].fillDefaults()
		if e.StablePages {
			if _, ok := e.Device.(PinnedWriter); !ok {
				s.log.Warn("nbd: StablePages is on but the device is no PinnedWriter; its writes are copied",
					"export", e.Name)
			}
		}
	}
	if s.mlock {
		maxBlock := int64(0)
		for _, e := range s.exports {
			maxBlock = max(maxBlock, int64(e.MaxBlock))
		}
		need := s.maxInFlightBytes + int64(1)<<bits.Len64(uint64(maxBlock-1))
		if err := checkMemlock(need); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// checkMemlock returns ErrMemlockLimit unless the process may mlock need bytes.
func checkMemlock(need int64) error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return fmt.Errorf("%w: getrlimit: %v", ErrMemlockLimit, err)
	}
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur >= uint64(need) || hasCapIPCLock() {
		return nil
	}
	return fmt.Errorf("%w: RLIMIT_MEMLOCK is %d bytes, one connection's buffers need %d "+
		"(MaxInFlightBytes plus the largest MaxBlock); raise the limit (ulimit -l, systemd "+
		"LimitMEMLOCK=), grant CAP_IPC_LOCK, or do not lock buffers", ErrMemlockLimit, rl.Cur, need)
}

// hasCapIPCLock reports whether the process may lock memory beyond RLIMIT_MEMLOCK. Tests
// replace it.
var hasCapIPCLock = func() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_IPC_LOCK/32].Effective&(1<<(unix.CAP_IPC_LOCK%32)) != 0
}

func (e *Export) fillDefaults() {
	if e.MinBlock == 0 {
		e.MinBlock = DefaultMinBlock
	}
	if e.PreferredBlock == 0 {
		e.PreferredBlock = max(DefaultPreferredBlock, e.MinBlock)
	}
	if e.MaxBlock == 0 {
		e.MaxBlock = max(DefaultMaxBlock, e.PreferredBlock)
	}
}

// validate checks an export with its defaults filled in, without changing e.
func (e Export) validate() error {
	if e.Device == nil {
		return errors.New("nil Device")
	}
	if len(e.Name) > maxStringLength || len(e.Description) > maxStringLength {
		return errors.New("name or description longer than 4096 bytes")
	}
	e.fillDefaults()
	pow2 := func(v uint32) bool { return v != 0 && bits.OnesCount32(v) == 1 }
	switch {
	case !pow2(e.MinBlock) || e.MinBlock > 64<<10:
		return fmt.Errorf("MinBlock %d is not a power of two up to 64 KiB", e.MinBlock)
	case !pow2(e.PreferredBlock) || e.PreferredBlock < max(e.MinBlock, 512):
		return fmt.Errorf("PreferredBlock %d is not a power of two >= max(MinBlock, 512)", e.PreferredBlock)
	case e.MaxBlock < e.PreferredBlock || e.MaxBlock%e.MinBlock != 0 || e.MaxBlock > 1<<30:
		return fmt.Errorf("MaxBlock %d is not a multiple of MinBlock in [PreferredBlock, 1 GiB]", e.MaxBlock)
	}
	return nil
}

// transmissionFlags are the flags advertised for e: everything the Device interface offers,
// minus the write side on a read-only export. CAN_MULTI_CONN rests on Device.Flush's contract.
func (e *Export) transmissionFlags() uint16 {
	f := wire.FlagHasFlags | wire.FlagSendFlush | wire.FlagCanMultiConn
	if e.ReadOnly {
		return f | wire.FlagReadOnly
	}
	return f | wire.FlagSendFUA | wire.FlagSendTrim | wire.FlagSendWriteZeroes
}

// lookup finds an export by name; "" is the first export.
func (s *Server) lookup(name string) *Export {
	if name == "" {
		return &s.exports[0]
	}
	for i := range s.exports {
		if s.exports[i].Name == name {
			return &s.exports[i]
		}
	}
	return nil
}

// Serve accepts connections on ln and serves each on its own goroutine until ctx is done or
// Accept fails for good. Serve owns ln and closes it. Then it stops every connection: each stops
// reading requests, finishes the requests it has (device calls complete, replies are written,
// within ShutdownTimeout) and closes. Serve returns only after every goroutine it started has
// ended: nil when ctx ended it, else the Accept error.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	connCtx, stopConns := context.WithCancel(ctx)
	stopListener := context.AfterFunc(ctx, func() { ln.Close() })
	var wg sync.WaitGroup
	defer func() {
		stopListener()
		stopConns() // every connection drains and closes...
		wg.Wait()   // ...before Serve returns
	}()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				// Out of file descriptors and the like: back off and retry, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("nbd: accept failed; retrying", "err", err, "delay", delay)
				select {
				case <-time.After(delay):
				case <-ctx.Done():
				}
				continue
			}
			ln.Close()
			s.log.Error("nbd: accept failed; stopping", "err", err)
			return err
		}
		delay = 0
		wg.Go(func() { s.ServeConn(connCtx, nc) })
	}
}

// ServeConn serves one connection: handshake, then transmission, until the client disconnects,
// breaks the protocol, or ctx is done (then in-flight requests are finished and replied to
// first). It closes nc and returns when every goroutine it started has ended. A connection
// past Options.MaxConnections is closed at once.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	log := s.log.With("remote", nc.RemoteAddr().String())
	if n := s.conns.Add(1); n > s.maxConns {
		s.conns.Add(-1)
		s.connsLog.warn(log, "nbd: connection limit reached; closing new connection before the greeting",
			"limit", "MaxConnections", "err", fmt.Errorf("%w: %d served (MaxConnections)", ErrTooManyConnections, n-1))
		return
	}
	defer s.conns.Add(-1)
	// The handshake has a deadline; shutdown makes reads fail at once and bounds the time to
	// write the replies still owed (reply writes keep to it: conn.shutdownAt). Both act on nc,
	// under a TLS session as well.
	c := newConn(s, nc, log)
	nc.SetDeadline(time.Now().Add(s.handshakeTimeout))
	stop := context.AfterFunc(ctx, func() { c.shutdownDeadlines() })
	defer stop()

	defer func() { c.nc.Close() }() // after STARTTLS, the TLS session: close_notify first
	h := &handshakeConn{r: c.br, w: nc, log: log}
	unixPeer(nc, &h.peer)
	if s.tlsMode != TLSOff {
		h.upgrade = func(h *handshakeConn) error { return c.startTLS(ctx, h) }
	}
	sess, err := s.handshake(h)
	if err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, errClientAbort):
			log.Debug("nbd: client aborted the handshake")
		case ctx.Err() != nil:
			log.Debug("nbd: handshake interrupted by shutdown", "err", err)
		case errors.As(err, &ne) && ne.Timeout():
			log.Warn("nbd: handshake too slow; closing connection", "limit", "HandshakeTimeout", "err",
				fmt.Errorf("%w after %v (HandshakeTimeout): %w", ErrHandshakeTimeout, s.handshakeTimeout, err))
		case isClosed(err):
			log.Debug("nbd: client left during the handshake", "err", err)
		default:
			log.Warn("nbd: handshake failed; closing connection", "err", err)
		}
		return
	}
	// Lift the handshake deadline, unless shutdown has begun: then its deadlines stand (the
	// AfterFunc has run, or runs after this, since ctx.Err is set before it is called).
	nc.SetDeadline(time.Time{})
	if ctx.Err() != nil {
		c.shutdownDeadlines()
	}
	log.Info("nbd: client connected", "export", sess.export.Name, "size", sess.size,
		"flags", fmt.Sprintf("%#x", sess.flags), "peer", h.peer.String())
	c.transmit(ctx, sess)
}

// shutdownDeadlines makes reads on c fail at once and gives the replies still owed
// ShutdownTimeout to be written.
func (c *conn) shutdownDeadlines() {
	d := time.Now().Add(c.srv.shutdownTimeout)
	c.shutdownAt.Store(d.UnixNano())
	c.stopReading()
	c.raw.SetWriteDeadline(d)
}

// aLongTimeAgo is a deadline in the past: it makes pending and future I/O fail at once.
var aLongTimeAgo = time.Unix(1, 0)
