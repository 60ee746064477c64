package nbdmember_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/member/nbdmember"
)

// killable is an NBD server on a unix socket that a test kills (listener and every connection
// closed at once, as when the server's process dies) and starts again on the same path. Each
// connection is served by a server of its own, made by mk with the connection's number
// (counted over restarts), so that tests can tell connections apart.
type killable struct {
	t    testing.TB
	path string

	mu     sync.Mutex // guards mk, ln, conns, n, cancel
	mk     func(conn int) *nbd.Server
	ln     net.Listener // nil while killed
	conns  []net.Conn
	n      int
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's ServeConn
}

// newKillable starts a killable server of mk's servers; it is killed when the test ends.
func newKillable(t testing.TB, mk func(conn int) *nbd.Server) *killable {
	s := &killable{t: t, path: filepath.Join(t.TempDir(), "nbd.sock"), mk: mk}
	s.start()
	t.Cleanup(s.kill)
	return s
}

// exportOf makes servers of one export "m" of dev (each connection's Device is dev(conn)).
func exportOf(t testing.TB, dev func(conn int) nbd.Device) func(int) *nbd.Server {
	return func(i int) *nbd.Server {
		srv, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "m", Device: dev(i)}}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Error(err)
		}
		return srv
	}
}

func the(dev nbd.Device) func(int) nbd.Device { return func(int) nbd.Device { return dev } }

// start listens again (safe from any goroutine; errors are reported with t.Error).
func (s *killable) start() {
	ln, err := net.Listen("unix", s.path)
	if err != nil {
		s.t.Error(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.ln, s.cancel = ln, cancel
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			if s.ln != ln { // killed meanwhile
				s.mu.Unlock()
				nc.Close()
				return
			}
			srv := s.mk(s.n)
			s.n++
			s.conns = append(s.conns, nc)
			s.wg.Add(1)
			s.mu.Unlock()
			go func() {
				defer s.wg.Done()
				if srv != nil {
					srv.ServeConn(ctx, nc)
				}
				nc.Close()
			}()
		}
	}()
}

// kill closes the listener and every connection, and returns once the server has stopped
// (every device call returned): a write the server read before is applied, or not, by then.
func (s *killable) kill() {
	s.cut()
	s.wg.Wait()
}

// cut is kill without the wait: device calls under way go on, their replies lost.
func (s *killable) cut() {
	s.mu.Lock()
	ln, conns, cancel := s.ln, s.conns, s.cancel
	s.ln, s.conns = nil, nil
	s.mu.Unlock()
	if ln == nil {
		return
	}
	ln.Close() // removes the socket file
	for _, c := range conns {
		c.Close()
	}
	cancel()
}

// setMk makes later connections be served by mk's servers.
func (s *killable) setMk(mk func(int) *nbd.Server) {
	s.mu.Lock()
	s.mk = mk
	s.mu.Unlock()
}

// cacheDevice is a MemDevice with a write cache: what was written since the last Flush is
// lost by crash, as a server that restarts loses its cache.
type cacheDevice struct {
	*nbdtest.MemDevice
	mu      sync.Mutex // guards durable
	durable []byte
}

func newCacheDevice(size int) *cacheDevice {
	return &cacheDevice{MemDevice: nbdtest.NewMemDevice(size), durable: make([]byte, size)}
}

func (d *cacheDevice) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.MemDevice.Flush(); err != nil {
		return err
	}
	d.durable = d.MemDevice.Bytes()
	return nil
}

// crash drops every write since the last Flush.
func (d *cacheDevice) crash() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.MemDevice.WriteAt(d.durable, 0)
}

// restart kills s, crashes dev (if any) and starts s again.
func restart(s *killable, dev *cacheDevice) {
	s.kill()
	if dev != nil {
		dev.crash()
	}
	s.start()
}

var quiet = slog.New(slog.DiscardHandler)

func mustRead(t *testing.T, m *nbdmember.Member, want []byte, off int64, what string) {
	t.Helper()
	got := make([]byte, len(want))
	if n, err := m.ReadAt(got, off); n != len(got) || err != nil {
		t.Fatalf("%s: ReadAt = %d, %v", what, n, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read back differs", what)
	}
}

func mustWrite(t *testing.T, m *nbdmember.Member, p []byte, off int64, what string) {
	t.Helper()
	if n, err := m.WriteAt(p, off); n != len(p) || err != nil {
		t.Fatalf("%s: WriteAt = %d, %v", what, n, err)
	}
}

// TestReconnect: a server that restarts between requests, with every write flushed, is
// reconnected to transparently: reads see what was flushed, and reads, writes and FLUSH go on;
// a server that is down for a while is waited for, within the deadline; and a server with no
// cache to flush (no FLUSH advertised) is reconnected to with writes unflushed.
func TestReconnect(t *testing.T) {
	dev := newCacheDevice(1 << 20)
	srv := newKillable(t, exportOf(t, the(dev)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 30 * time.Second, Logger: quiet})
	data := random(256 << 10)
	mustWrite(t, m, data[:64<<10], 0, "before the restart")
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	restart(srv, dev)
	mustRead(t, m, data[:64<<10], 0, "after the restart")
	mustWrite(t, m, data[64<<10:128<<10], 64<<10, "after the restart")
	mustRead(t, m, data[:128<<10], 0, "after the restart")
	if err := m.Sync(); err != nil {
		t.Fatalf("Sync after the restart: %v", err)
	}
	if n := nbdmember.Reconnects(m); n != 1 {
		t.Errorf("%d reconnects, want 1", n)
	}

	// Down for a while: the request waits (dialing with backoff) until the server is back.
	srv.kill()
	dev.crash()
	back := make(chan struct{})
	go func() {
		defer close(back)
		time.Sleep(300 * time.Millisecond)
		srv.start()
	}()
	mustRead(t, m, data[:128<<10], 0, "while the server comes back")
	<-back
	if n := nbdmember.Reconnects(m); n != 2 {
		t.Errorf("%d reconnects, want 2", n)
	}

	// Sync with nothing written since the last one, across a restart: nothing to flush.
	restart(srv, dev)
	if err := m.Sync(); err != nil {
		t.Errorf("Sync across a restart with nothing unflushed: %v", err)
	}
	mustRead(t, m, data[:128<<10], 0, "after the third restart")

	// A server with no cache (no FLUSH): its acknowledgements are durable.
	m.MaskFlags(client.FlagSendFlush)
	mustWrite(t, m, data[128<<10:], 128<<10, "no FLUSH")
	restart(srv, nil)
	mustRead(t, m, data, 0, "no FLUSH, after the restart")
}

// TestReconnectUnflushed: a server that restarts with writes acknowledged since the last FLUSH
// may have lost them: the member does not reconnect but fails, every request returning
// ErrLostWrites (a read must not return what the restart left), and Sync fails too. Also when a
// FLUSH succeeded before and more was written since, and with several requests in flight.
func TestReconnectUnflushed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flushed bool
	}{{"never flushed", false}, {"written since the flush", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newCacheDevice(1 << 20)
			srv := newKillable(t, exportOf(t, the(dev)))
			m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 30 * time.Second, Logger: quiet})
			data := random(128 << 10)
			if tc.flushed {
				mustWrite(t, m, data[:64<<10], 0, "first")
				if err := m.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			mustWrite(t, m, data[64<<10:], 64<<10, "unflushed")
			restart(srv, dev) // the unflushed write is gone
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() {
					got := make([]byte, 64<<10)
					n, err := m.ReadAt(got, int64(i%2)*64<<10)
					var e *nbdmember.Error
					if n != 0 || !errors.Is(err, nbdmember.ErrLostWrites) || !errors.As(err, &e) {
						t.Errorf("read after a restart that lost a write: %d, %v; want 0 and ErrLostWrites in an *Error", n, err)
					}
				})
			}
			wg.Wait()
			if err := m.Sync(); !errors.Is(err, nbdmember.ErrLostWrites) {
				t.Errorf("Sync: %v, want ErrLostWrites", err)
			}
			if _, err := m.WriteAt(data[:4096], 0); !errors.Is(err, nbdmember.ErrLostWrites) {
				t.Errorf("WriteAt: %v, want ErrLostWrites", err)
			}
			if n := nbdmember.Reconnects(m); n != 0 {
				t.Errorf("%d reconnects, want 0", n)
			}
		})
	}
}

// TestReconnectInFlight: reads in flight when the server dies are sent again once it is back
// and return the right bytes; a write in flight fails, and so does the member (its reply was
// cut off: the server may apply it, or not), even with every earlier write flushed.
func TestReconnectInFlight(t *testing.T) {
	dev := newCacheDevice(1 << 20)
	data := random(1 << 20)
	dev.MemDevice.WriteAt(data, 0)
	dev.Flush()
	var hold atomic.Bool
	arrived, release := make(chan struct{}, 16), make(chan struct{})
	dev.Delay = func(op nbdtest.Op, off, n int64) {
		if hold.Load() {
			arrived <- struct{}{}
			<-release
		}
	}
	srv := newKillable(t, exportOf(t, the(dev)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 30 * time.Second, Logger: quiet})

	kill := func(n int) {
		t.Helper()
		for range n {
			select {
			case <-arrived:
			case <-time.After(30 * time.Second):
				t.Fatal("requests did not reach the server")
			}
		}
		srv.cut() // the sockets closed before the device answers
		hold.Store(false)
		close(release)
		srv.kill() // waits for the device calls
		release = make(chan struct{})
		srv.start()
	}

	hold.Store(true)
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			got := make([]byte, 64<<10)
			off := int64(i) * 64 << 10
			if _, err := m.ReadAt(got, off); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, data[off:off+64<<10]) {
				errs <- errors.New("read back differs")
				return
			}
			errs <- nil
		}()
	}
	kill(4)
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("read in flight across a restart: %v", err)
		}
	}
	if n := nbdmember.Reconnects(m); n != 1 {
		t.Errorf("%d reconnects, want 1", n)
	}

	hold.Store(true)
	go func() {
		_, err := m.WriteAt(data[:4096], 0)
		errs <- err
	}()
	kill(1)
	if err := <-errs; !errors.Is(err, client.ErrDisconnected) {
		t.Errorf("write in flight across a restart: %v, want ErrDisconnected", err)
	}
	if _, err := m.ReadAt(make([]byte, 4096), 0); !errors.Is(err, nbdmember.ErrLostWrites) {
		t.Errorf("read after a write was cut off: %v, want ErrLostWrites", err)
	}
}

// TestReconnectDeadline: a server that stays down costs each request one deadline
// (ErrDeadline, with the dial's error); with nothing unflushed the member has not failed, and
// once the server is back requests go through again (after at most the dial backoff).
func TestReconnectDeadline(t *testing.T) {
	dev := newCacheDevice(1 << 20)
	srv := newKillable(t, exportOf(t, the(dev)))
	const timeout = 300 * time.Millisecond
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: timeout, Logger: quiet})
	data := random(64 << 10)
	mustWrite(t, m, data, 0, "before")
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	srv.kill()
	for range 2 {
		start := time.Now()
		_, err := m.ReadAt(make([]byte, 4096), 0)
		d := time.Since(start)
		if !errors.Is(err, nbdmember.ErrDeadline) {
			t.Errorf("read with the server down: %v, want ErrDeadline", err)
		}
		if d < timeout || d > 30*time.Second {
			t.Errorf("read with the server down returned after %v; want the deadline, %v", d, timeout)
		}
	}
	srv.start()
	// The next dial waits out the backoff the failed ones built up (up to maxBackoff, longer
	// than this deadline): a read may still pass its deadline before it, never fail otherwise.
	for end := time.Now().Add(30 * time.Second); ; {
		_, err := m.ReadAt(make([]byte, 4096), 0)
		if err == nil {
			break
		}
		if !errors.Is(err, nbdmember.ErrDeadline) || time.Now().After(end) {
			t.Fatalf("read with the server back: %v", err)
		}
	}
	mustRead(t, m, data, 0, "server back")
}

// TestReconnectSizeChanged: a server that comes back with the export at another size is
// refused: the member fails with ErrExportChanged, for good.
func TestReconnectSizeChanged(t *testing.T) {
	srv := newKillable(t, exportOf(t, the(nbdtest.NewMemDevice(1<<20))))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 30 * time.Second, Logger: quiet})
	if _, err := m.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	srv.kill()
	srv.setMk(exportOf(t, the(nbdtest.NewMemDevice(2<<20))))
	srv.start()
	for range 2 {
		if _, err := m.ReadAt(make([]byte, 4096), 0); !errors.Is(err, nbdmember.ErrExportChanged) {
			t.Errorf("read from an export of another size: %v, want ErrExportChanged", err)
		}
	}
	if err := m.Sync(); !errors.Is(err, nbdmember.ErrExportChanged) {
		t.Errorf("Sync: %v, want ErrExportChanged", err)
	}
	if n := nbdmember.Reconnects(m); n != 0 {
		t.Errorf("%d reconnects, want 0", n)
	}
}

// TestReconnectTLS: an nbds member reconnects over TLS with the files it was opened with, to a
// server that serves only over TLS.
func TestReconnectTLS(t *testing.T) {
	dev := newCacheDevice(1 << 20)
	_, so, opts := tlsSetup(t, nbd.Export{Name: "m", Device: dev})
	srv := newKillable(t, func(int) *nbd.Server {
		srv, err := nbd.NewServer(so)
		if err != nil {
			t.Error(err)
		}
		return srv
	})
	opts.Timeout, opts.Logger = 30*time.Second, quiet
	m := open(t, "nbds+unix:///m?socket="+srv.path, member.Exclusive, opts)
	data := random(64 << 10)
	mustWrite(t, m, data, 0, "before the restart")
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	restart(srv, dev)
	mustRead(t, m, data, 0, "after the restart")
	if n := nbdmember.Reconnects(m); n != 1 {
		t.Errorf("%d reconnects, want 1", n)
	}
}

// sameBytes is a recheck that passes an export whose first len(want) bytes are want, and
// fails with errOther one that has other bytes there; it counts its calls into checks.
func sameBytes(want []byte, errOther error, checks *atomic.Int64) func(io.ReaderAt) error {
	return func(r io.ReaderAt) error {
		checks.Add(1)
		got := make([]byte, len(want))
		if _, err := r.ReadAt(got, 0); err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			return errOther
		}
		return nil
	}
}

// trust sets a recheck that every connection passes, so that m opens the connections
// beyond Open's first.
func trust(t *testing.T, m *nbdmember.Member) {
	t.Helper()
	if err := m.SetRecheck(func(io.ReaderAt) error { return nil }); err != nil {
		t.Fatalf("SetRecheck: %v", err)
	}
}

// TestReconnectRecheck: a reconnection is used only once it passes the owner's recheck
// (SetRecheck, reading through the new connection; SetRecheck runs it on the connection in
// use too): a server back with the same bytes is reconnected; one back with other bytes of
// the same size and flags (another disk behind the URI) fails the member with
// ErrExportChanged wrapping the recheck's error, for good.
func TestReconnectRecheck(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	want := random(4096)
	if _, err := dev.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	srv := newKillable(t, exportOf(t, the(dev)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 30 * time.Second, Logger: quiet})
	var _ member.Rechecker = m
	errOther := errors.New("not the same disk")
	var checks atomic.Int64
	if err := m.SetRecheck(sameBytes(want, errOther, &checks)); err != nil || checks.Load() != 1 {
		t.Fatalf("SetRecheck: %v after %d checks, want nil after 1 (the connection in use)", err, checks.Load())
	}
	srv.kill()
	srv.start()
	mustRead(t, m, want, 0, "back with the same bytes")
	if n := nbdmember.Reconnects(m); n != 1 || checks.Load() != 2 {
		t.Errorf("%d reconnects, %d checks; want 1 and 2", n, checks.Load())
	}

	srv.kill()
	srv.setMk(exportOf(t, the(nbdtest.NewMemDevice(1<<20))))
	srv.start()
	for range 2 {
		if _, err := m.ReadAt(make([]byte, 4096), 0); !errors.Is(err, nbdmember.ErrExportChanged) || !errors.Is(err, errOther) {
			t.Errorf("read from another disk behind the URI: %v, want ErrExportChanged and the recheck's error", err)
		}
	}
	if n := nbdmember.Reconnects(m); n != 1 {
		t.Errorf("%d reconnects, want still 1", n)
	}
}

// TestReconnectRecheckConns: with several connections every one of a reconnection must pass
// the recheck: a server that routes the second connection of a restart to another disk fails
// the member (ErrExportChanged), and no read returns the other disk's bytes.
func TestReconnectRecheckConns(t *testing.T) {
	right, wrong := nbdtest.NewMemDevice(1<<20), nbdtest.NewMemDevice(1<<20)
	want := random(64 << 10)
	if _, err := right.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	srv := newKillable(t, exportOf(t, the(right)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Conns: 2, Timeout: 30 * time.Second, Logger: quiet})
	errOther := errors.New("not the same disk")
	var checks atomic.Int64
	if err := m.SetRecheck(sameBytes(want[:4096], errOther, &checks)); err != nil {
		t.Fatal(err)
	}
	if n := nbdmember.Conns(m); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	srv.kill()
	srv.setMk(exportOf(t, func(conn int) nbd.Device { // the restart's first connection is the right disk
		if conn == 2 {
			return right
		}
		return wrong
	}))
	srv.start()
	for i := range 4 {
		got := make([]byte, len(want))
		if _, err := m.ReadAt(got, 0); !errors.Is(err, nbdmember.ErrExportChanged) || !errors.Is(err, errOther) {
			t.Errorf("read %d after the restart with the second connection routed elsewhere: %v, want ErrExportChanged and the recheck's error", i, err)
		}
	}
}

// TestOpenRecheckConns: Open makes one connection; the others Options.Conns asks for are
// opened once the owner's recheck is set (SetRecheck) and each must pass it before it
// carries a request. A server that routes the second connection to another disk of the same
// size and flags fails the member: SetRecheck returns ErrExportChanged wrapping the recheck's
// error, every request from then on returns it (none reads or writes either disk), and the
// other disk is never written.
func TestOpenRecheckConns(t *testing.T) {
	right, wrong := nbdtest.NewMemDevice(1<<20), nbdtest.NewMemDevice(1<<20)
	want := random(1 << 20)
	if _, err := right.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	srv := newKillable(t, exportOf(t, func(conn int) nbd.Device {
		if conn == 0 {
			return right
		}
		return wrong
	}))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Conns: 2, Timeout: 30 * time.Second, Logger: quiet})
	errOther := errors.New("not the same disk")
	var checks atomic.Int64
	err := m.SetRecheck(sameBytes(want[:4096], errOther, &checks))
	if !errors.Is(err, nbdmember.ErrExportChanged) || !errors.Is(err, errOther) {
		t.Errorf("SetRecheck with the second connection routed to another disk: %v, want ErrExportChanged and the recheck's error", err)
	}
	var wg sync.WaitGroup
	for i := range 16 { // in flight together: on two connections they would spread over both
		wg.Go(func() {
			off := int64(i) * 64 << 10
			got := make([]byte, 64<<10)
			if _, err := m.ReadAt(got, off); err == nil && !bytes.Equal(got, want[off:off+64<<10]) {
				t.Errorf("read at %d returned another disk's bytes", off)
			} else if !errors.Is(err, nbdmember.ErrExportChanged) {
				t.Errorf("read at %d: %v, want ErrExportChanged", off, err)
			}
			if _, err := m.WriteAt(random(64<<10), off); !errors.Is(err, nbdmember.ErrExportChanged) {
				t.Errorf("write at %d: %v, want ErrExportChanged", off, err)
			}
		})
	}
	wg.Wait()
	got := make([]byte, 1<<20)
	if _, err := wrong.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, 1<<20)) {
		t.Error("the other disk was written")
	}
}

// TestOpenConnsAdmitted: SetRecheck admits the connection in use and opens the others, each
// checked once, while requests are in flight; a server that admits fewer connections gets
// as many as it admits.
func TestOpenConnsAdmitted(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	want := random(1 << 20)
	if _, err := dev.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	srv := newKillable(t, exportOf(t, the(dev)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Conns: 4, Timeout: 30 * time.Second, Logger: quiet})
	if n := nbdmember.Conns(m); n != 1 {
		t.Errorf("%d connections before SetRecheck, want 1", n)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			off := int64(i) * 64 << 10
			got := make([]byte, 64<<10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := m.ReadAt(got, off); err != nil || !bytes.Equal(got, want[off:off+64<<10]) {
					t.Errorf("read at %d while connections are added: %v", off, err)
					return
				}
			}
		})
	}
	var checks atomic.Int64
	if err := m.SetRecheck(sameBytes(want[:4096], errors.New("not the same disk"), &checks)); err != nil {
		t.Errorf("SetRecheck: %v", err)
	}
	close(stop)
	wg.Wait()
	if n, k := nbdmember.Conns(m), checks.Load(); n != 4 || k != 4 {
		t.Errorf("%d connections after %d checks, want 4 after 4", n, k)
	}

	limited := newKillable(t, func(conn int) *nbd.Server {
		if conn >= 2 {
			return nil // refused: the connection is closed at once
		}
		return exportOf(t, the(dev))(conn)
	})
	m2 := open(t, uri(limited.path, "m"), member.Exclusive, nbdmember.Options{Conns: 4, Timeout: 30 * time.Second, Logger: quiet})
	trust(t, m2)
	if n := nbdmember.Conns(m2); n != 2 {
		t.Errorf("server admitting 2 connections: %d, want 2", n)
	}
}
