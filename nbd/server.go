package nbd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"sync"
	"time"
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
}

// Server serves exports over NBD. Create it with NewServer; it is safe for concurrent use, and
// Serve may run on several listeners at once.
type Server struct {
	exports          []Export // validated, defaults filled in; read-only after NewServer
	log              *slog.Logger
	maxInFlightBytes int64
	maxInFlightReqs  int
	shutdownTimeout  time.Duration
}

// NewServer checks opts, fills in defaults and returns a server. It returns ErrNoExports,
// ErrInvalidExport or ErrInvalidOptions (wrapped with the detail) for a bad configuration.
func NewServer(opts Options) (*Server, error) {
	if len(opts.Exports) == 0 {
		return nil, ErrNoExports
	}
	if opts.MaxInFlightBytes < 0 || opts.MaxInFlightRequests < 0 || opts.ShutdownTimeout < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalidOptions)
	}
	s := &Server{
		exports:          make([]Export, len(opts.Exports)),
		log:              opts.Logger,
		maxInFlightBytes: opts.MaxInFlightBytes,
		maxInFlightReqs:  opts.MaxInFlightRequests,
		shutdownTimeout:  opts.ShutdownTimeout,
	}
	if s.log == nil {
		s.log = slog.Default()
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
	seen := make(map[string]bool)
	for i, e := range opts.Exports {
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("%w: export %d (%q): %v", ErrInvalidExport, i, e.Name, err)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("%w: duplicate name %q", ErrInvalidExport, e.Name)
		}
		seen[e.Name] = true
		s.exports[i] = e
		s.exports[i].fillDefaults()
	}
	return s, nil
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
	f := tflagHasFlags | tflagSendFlush | tflagCanMultiConn
	if e.ReadOnly {
		return f | tflagReadOnly
	}
	return f | tflagSendFUA | tflagSendTrim | tflagSendWriteZeroes
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
// first). It closes nc and returns when every goroutine it started has ended.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	log := s.log.With("remote", nc.RemoteAddr().String())
	// On shutdown: no more reading (pending reads fail at once), and a bounded time to write
	// the replies still owed.
	stop := context.AfterFunc(ctx, func() {
		nc.SetReadDeadline(aLongTimeAgo)
		nc.SetWriteDeadline(time.Now().Add(s.shutdownTimeout))
	})
	defer stop()

	c := newConn(s, nc, log)
	sess, err := s.handshake(c.br, nc, log)
	if err != nil {
		switch {
		case errors.Is(err, errClientAbort):
			log.Debug("nbd: client aborted the handshake")
		case ctx.Err() != nil:
			log.Debug("nbd: handshake interrupted by shutdown", "err", err)
		case isClosed(err):
			log.Debug("nbd: client left during the handshake", "err", err)
		default:
			log.Warn("nbd: handshake failed; closing connection", "err", err)
		}
		return
	}
	log.Info("nbd: client connected", "export", sess.export.Name, "size", sess.size,
		"flags", fmt.Sprintf("%#x", sess.flags))
	c.transmit(ctx, sess)
}

// aLongTimeAgo is a deadline in the past: it makes pending and future I/O fail at once.
var aLongTimeAgo = time.Unix(1, 0)
