package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

var (
	_ Device    = (*nbdtest.MemDevice)(nil)
	_ FUAWriter = nbdtest.FUADevice{}
)

// logStore is a slog.Handler that keeps every record, so tests can ask why a connection closed.
type logStore struct {
	mu   sync.Mutex // guards recs
	recs []slog.Record
}

func (l *logStore) Enabled(context.Context, slog.Level) bool { return true }
func (l *logStore) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logStore) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logStore) WithGroup(string) slog.Handler      { return l }

// loggedErr reports whether some record carries an "err" attribute that errors.Is target.
func (l *logStore) loggedErr(target error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		found := false
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok && a.Key == "err" && errors.Is(err, target) {
				found = true
				return false
			}
			return true
		})
		if found {
			return true
		}
	}
	return false
}

// testServer builds a server over exports with a recording logger.
func testServer(t testing.TB, opts Options) (*Server, *logStore) {
	t.Helper()
	logs := &logStore{}
	opts.Logger = slog.New(logs)
	s, err := NewServer(opts)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	return s, logs
}

// serveUnix serves opts on a fresh unix socket until the test ends; it returns the server, its
// log records and the socket's path.
func serveUnix(t testing.TB, opts Options) (*Server, *logStore, string) {
	t.Helper()
	s, logs := testServer(t, opts)
	return s, logs, nbdtest.ServeUnix(t, s)
}

// pipe serves one connection over net.Pipe and returns the client end. Cleanup closes the
// client and waits for ServeConn to return; done is closed when it has.
func pipe(t testing.TB, s *Server) (*rawClient, <-chan struct{}) {
	t.Helper()
	cc, sc := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ServeConn(context.Background(), sc)
	}()
	t.Cleanup(func() {
		cc.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServeConn did not return after the client closed")
		}
	})
	return newRawClient(t, cc), done
}

// unixListener listens on a fresh unix socket and returns it with its path.
func unixListener(t testing.TB) (net.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nbd.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return ln, path
}

// rawClient speaks the protocol byte by byte, failing the test on any I/O error.
type rawClient struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

func newRawClient(t testing.TB, nc net.Conn) *rawClient {
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawClient{t: t, nc: nc, r: bufio.NewReader(nc)}
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("client write: %v", err)
	}
}

func (c *rawClient) read(n int) []byte {
	c.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		c.t.Fatalf("client read %d bytes: %v", n, err)
	}
	return b
}

// expectClosed checks that the server closed the connection without sending anything more.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	var b [1]byte
	n, err := c.r.Read(b[:])
	if err == nil {
		c.t.Fatalf("connection still open: read %d byte(s) %x", n, b[:n])
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, syscall.ECONNRESET) {
		c.t.Fatalf("expected EOF, got %v", err)
	}
}

// greet reads the greeting, checks it and sends the client flags.
func (c *rawClient) greet(clientFlags uint32) {
	c.t.Helper()
	g := c.read(18)
	if binary.BigEndian.Uint64(g[0:]) != wire.MagicNBD || binary.BigEndian.Uint64(g[8:]) != wire.MagicOption {
		c.t.Fatalf("bad greeting %x", g)
	}
	if f := binary.BigEndian.Uint16(g[16:]); f != wire.FlagFixedNewstyle|wire.FlagNoZeroes {
		c.t.Fatalf("handshake flags %#x, want FIXED_NEWSTYLE|NO_ZEROES", f)
	}
	c.write(binary.BigEndian.AppendUint32(nil, clientFlags))
}

func (c *rawClient) option(id uint32, data []byte) {
	c.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, wire.MagicOption)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	c.write(append(b, data...))
}

type optReply struct {
	id, typ uint32
	data    []byte
}

func (c *rawClient) optionReply() optReply {
	c.t.Helper()
	h := c.read(20)
	if m := binary.BigEndian.Uint64(h); m != wire.MagicOptionReply {
		c.t.Fatalf("option reply magic %#x", m)
	}
	r := optReply{id: binary.BigEndian.Uint32(h[8:]), typ: binary.BigEndian.Uint32(h[12:])}
	r.data = c.read(int(binary.BigEndian.Uint32(h[16:])))
	return r
}

func infoData(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// exportInfo collects the NBD_REP_INFO replies of an INFO or GO.
type exportInfo struct {
	size                uint64
	flags               uint16
	name, desc          string
	hasName, hasDesc    bool
	minB, prefB, maxB   uint32
	hasBlock, hasExport bool
}

// infoReplies reads replies up to the final one and returns the info and the final reply type.
func (c *rawClient) infoReplies(id uint32) (exportInfo, uint32) {
	c.t.Helper()
	var in exportInfo
	for {
		r := c.optionReply()
		if r.id != id {
			c.t.Fatalf("reply to option %d, want %d", r.id, id)
		}
		if r.typ != wire.RepInfo {
			return in, r.typ
		}
		switch binary.BigEndian.Uint16(r.data) {
		case wire.InfoExport:
			in.hasExport = true
			in.size = binary.BigEndian.Uint64(r.data[2:])
			in.flags = binary.BigEndian.Uint16(r.data[10:])
		case wire.InfoName:
			in.hasName, in.name = true, string(r.data[2:])
		case wire.InfoDescription:
			in.hasDesc, in.desc = true, string(r.data[2:])
		case wire.InfoBlockSize:
			in.hasBlock = true
			in.minB = binary.BigEndian.Uint32(r.data[2:])
			in.prefB = binary.BigEndian.Uint32(r.data[6:])
			in.maxB = binary.BigEndian.Uint32(r.data[10:])
		}
	}
}

// handshakeGo greets with NO_ZEROES and enters transmission with NBD_OPT_GO on name.
func (c *rawClient) handshakeGo(name string) exportInfo {
	c.t.Helper()
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	c.option(wire.OptGo, infoData(name, wire.InfoBlockSize))
	in, final := c.infoReplies(wire.OptGo)
	if final != wire.RepAck {
		c.t.Fatalf("NBD_OPT_GO %q: final reply %#x", name, final)
	}
	return in
}

func (c *rawClient) request(typ, flags uint16, cookie, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	var h [wire.RequestHeaderSize]byte
	wire.PutRequest(&h, flags, typ, cookie, off, length)
	c.write(append(h[:], payload...))
}

// reply reads a simple reply header.
func (c *rawClient) reply() (errno uint32, cookie uint64) {
	c.t.Helper()
	h := wire.DecodeReply((*[wire.ReplyHeaderSize]byte)(c.read(wire.ReplyHeaderSize)))
	if h.ReplyMagic != wire.MagicSimpleReply {
		c.t.Fatalf("reply magic %#x", h.ReplyMagic)
	}
	return h.Error, h.Handle
}

// do sends one request and waits for its reply (and payload, for a successful READ).
func (c *rawClient) do(typ, flags uint16, off uint64, length uint32, payload []byte) (uint32, []byte) {
	c.t.Helper()
	const cookie = 0xc0ffee
	c.request(typ, flags, cookie, off, length, payload)
	errno, got := c.reply()
	if got != cookie {
		c.t.Fatalf("reply cookie %#x, want %#x", got, cookie)
	}
	if typ == wire.CmdRead && errno == 0 {
		return 0, c.read(int(length))
	}
	return errno, nil
}
