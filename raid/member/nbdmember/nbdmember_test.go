package nbdmember_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/testpki"
	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/member/nbdmember"
)

func TestMain(m *testing.M) {
	nbdmember.Register(func() nbdmember.Options { return nbdmember.Options{} })
	os.Exit(m.Run())
}

// serve serves exports on a unix socket until the test ends and returns the socket's path.
func serve(t *testing.T, exports ...nbd.Export) string {
	t.Helper()
	srv, err := nbd.NewServer(nbd.Options{Exports: exports, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return nbdtest.ServeUnix(t, srv)
}

func uri(sock, export string) string { return "nbd+unix:///" + export + "?socket=" + sock }

func open(t *testing.T, spec string, use member.Use, opts nbdmember.Options) *nbdmember.Member {
	t.Helper()
	m, err := nbdmember.Open(spec, use, opts)
	if err != nil {
		t.Fatalf("Open %s: %v", spec, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func random(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{7})
	r.Read(b)
	return b
}

// TestRegistered: member.Open dispatches the URI prefixes to the kind; Name is the URI, Size
// the export's, and the member has no local path (no lock).
func TestRegistered(t *testing.T) {
	sock := serve(t, nbd.Export{Name: "m0", Device: nbdtest.NewMemDevice(3 << 20)})
	spec := uri(sock, "m0")
	m, err := member.Open(spec, member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Name() != spec || m.Size() != 3<<20 {
		t.Errorf("Name %q Size %d, want %q and %d", m.Name(), m.Size(), spec, 3<<20)
	}
	if p := member.SpecPath(spec); p != "" {
		t.Errorf("SpecPath = %q, want \"\"", p)
	}
	if _, ok := m.(member.DSyncWriter); !ok {
		t.Error("not a DSyncWriter")
	}
	if !member.Waits(m) {
		t.Error("member.Waits false: the array would write its batches one member after another")
	}
}

// TestSplitAtMaxBlock: requests longer than the server's maximum block size are split at it
// (the server refuses longer ones), and every byte arrives where it belongs.
func TestSplitAtMaxBlock(t *testing.T) {
	dev := nbdtest.NewMemDevice(4 << 20)
	sock := serve(t, nbd.Export{Name: "m", Device: dev, MinBlock: 512, PreferredBlock: 4096, MaxBlock: 64 << 10})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{})
	data := random(1<<20 + 8192)
	const off = 12288
	if n, err := m.WriteAt(data, off); n != len(data) || err != nil {
		t.Fatalf("WriteAt = %d, %v", n, err)
	}
	if got := dev.Stats().Writes; got != 17 {
		t.Errorf("%d WRITEs, want 17 (16 of 64 KiB and one of 8 KiB)", got)
	}
	if !bytes.Equal(dev.Bytes()[off:off+len(data)], data) {
		t.Fatal("device does not hold what was written")
	}
	got := make([]byte, len(data))
	if n, err := m.ReadAt(got, off); n != len(got) || err != nil {
		t.Fatalf("ReadAt = %d, %v", n, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	// Short requests go whole.
	before := dev.Stats().Reads
	if _, err := m.ReadAt(got[:64<<10], 0); err != nil || dev.Stats().Reads != before+1 {
		t.Errorf("64 KiB read: %v, %d READs, want 1", err, dev.Stats().Reads-before)
	}
}

// TestErrorsAreEIO: a server's error reply, whatever its errno, is an *Error with errno EIO to
// the array, the server's errno inside; a read fails with no bytes claimed.
func TestErrorsAreEIO(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	dev.Fail = func(op nbdtest.Op, off, n int64) error {
		if off >= 512<<10 {
			return syscall.ENOSPC
		}
		return nil
	}
	sock := serve(t, nbd.Export{Name: "m", Device: dev})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{})
	p := make([]byte, 8192)
	for _, tc := range []struct {
		op string
		f  func() (int, error)
	}{
		{"read", func() (int, error) { return m.ReadAt(p, 512<<10) }},
		{"write", func() (int, error) { return m.WriteAt(p, 512<<10) }},
		{"dsync", func() (int, error) { return m.WriteAtDSync(p, 512<<10) }},
		{"trim", func() (int, error) { return 0, m.Trim(512<<10, 8192) }},
	} {
		n, err := tc.f()
		var e *nbdmember.Error
		if n != 0 || !errors.As(err, &e) || e.Errno() != uint32(syscall.EIO) {
			t.Errorf("%s: %d, %v; want 0 and an *Error with errno EIO", tc.op, n, err)
		}
	}
	if _, err := m.ReadAt(p, 0); err != nil {
		t.Errorf("read after errors: %v (the connection goes on)", err)
	}
}

// TestShortDeviceRead: a server whose device returns fewer bytes than asked replies with an
// error, and the member's read is an error, never zeroes.
func TestShortDeviceRead(t *testing.T) {
	sock := serve(t, nbd.Export{Name: "m", Device: shortDevice{nbdtest.NewMemDevice(1 << 20)}})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{})
	p := make([]byte, 8192)
	if _, err := member.ReadFull(m, p, 4096); err == nil {
		t.Fatal("short read of the server's device: no error")
	}
}

type shortDevice struct{ *nbdtest.MemDevice }

func (d shortDevice) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.MemDevice.ReadAt(p[:len(p)/2], off)
	return n, err
}

// TestCutReply: a reply cut off mid-payload (the server's host gone) breaks the connection and
// nothing of it is taken for data: the read is sent again on a new connection and returns the
// right bytes. A server whose every reply is cut costs the read its deadline: an error, never
// the bytes that came.
func TestCutReply(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	data := random(1 << 20)
	if _, err := dev.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	sock := serve(t, nbd.Export{Name: "m", Device: dev})
	px := newCutProxy(t, sock)
	m := open(t, uri(px.path, "m"), member.Exclusive, nbdmember.Options{Logger: quiet})
	short := open(t, uri(px.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 500 * time.Millisecond, Logger: quiet})
	p := make([]byte, 64<<10)
	px.cutAfter(1000, false) // the next reply is cut 1000 bytes in
	if n, err := m.ReadAt(p, 0); n != len(p) || err != nil || !bytes.Equal(p, data[:len(p)]) {
		t.Fatalf("READ whose reply was cut: %d, %v, right bytes %v; want it sent again", n, err, bytes.Equal(p, data[:len(p)]))
	}
	if r := nbdmember.Reconnects(m); r != 1 {
		t.Errorf("%d reconnects, want 1", r)
	}
	clear(p)
	px.cutAfter(1000, true) // every connection's stream, from its start
	n, err := short.ReadAt(p, 0)
	if n != 0 || !errors.Is(err, nbdmember.ErrDeadline) {
		t.Fatalf("READ with every reply cut: %d, %v; want 0 and ErrDeadline", n, err)
	}
}

// cutProxy forwards unix socket connections to the server and, once armed, cuts the
// server-to-client stream after so many bytes: the next connection's to read, or every one's.
type cutProxy struct {
	path   string
	cut    atomic.Int64 // > 0: armed, with the bytes to forward before the cut
	always atomic.Bool  // stay armed after a cut
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	px := &cutProxy{path: filepath.Join(t.TempDir(), "proxy.sock")}
	ln, err := net.Listen("unix", px.path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("unix", target)
			if err != nil {
				cc.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, cc, sc)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(sc, cc); sc.Close() }()
			go func() { defer wg.Done(); px.down(cc, sc); cc.Close(); sc.Close() }()
		}
	}()
	return px
}

func (px *cutProxy) cutAfter(n int64, always bool) {
	px.always.Store(always)
	px.cut.Store(n)
}

func (px *cutProxy) down(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	var left int64 // > 0: bytes still to forward before the cut
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if left == 0 {
			if left = px.cut.Load(); left > 0 && !px.always.Load() {
				px.cut.Store(0)
			}
		}
		if left > 0 {
			if int64(n) >= left {
				dst.Write(buf[:left])
				return
			}
			left -= int64(n)
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestDeadline: a server that stops answering makes the request return within its deadline
// with ErrDeadline, the other requests in flight with it, and every later one fails: the
// array then fails the member instead of hanging.
func TestDeadline(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	stall := make(chan struct{})
	var stalled atomic.Bool
	dev.Delay = func(op nbdtest.Op, off, n int64) {
		if stalled.Load() {
			<-stall
		}
	}
	sock := serve(t, nbd.Export{Name: "m", Device: dev})
	t.Cleanup(func() { close(stall) }) // before the server's cleanup (LIFO)
	const timeout = 300 * time.Millisecond
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{Timeout: timeout})
	p := make([]byte, 4096)
	if _, err := m.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	stalled.Store(true)
	start := time.Now()
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			q := make([]byte, 4096)
			_, err := m.ReadAt(q, int64(i)*4096)
			errs <- err
		}()
	}
	for range 4 {
		select {
		case err := <-errs:
			var e *nbdmember.Error
			if !errors.Is(err, nbdmember.ErrDeadline) || !errors.As(err, &e) || e.Errno() != uint32(syscall.EIO) {
				t.Errorf("stalled read: %v, want ErrDeadline in an *Error (EIO)", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("stalled read did not return within 30s (deadline 300ms)")
		}
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("returned after %v, before the deadline %v", d, timeout)
	}
	if _, err := m.WriteAt(p, 0); !errors.Is(err, nbdmember.ErrDeadline) {
		t.Errorf("write after the deadline: %v, want ErrDeadline", err)
	}
	if err := m.Sync(); err == nil {
		t.Error("Sync after the deadline: no error")
	}
}

// TestDSyncFUA: WriteAtDSync is one FUA WRITE where the server advertises FUA, else a WRITE
// and a FLUSH; Sync is FLUSH.
func TestDSyncFUA(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	sock := serve(t, nbd.Export{Name: "m", Device: nbdtest.FUADevice{MemDevice: dev}})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{})
	data := random(8192)
	if _, err := m.WriteAtDSync(data, 4096); err != nil {
		t.Fatal(err)
	}
	if s := dev.Stats(); s.FUAWrites != 1 || s.Flushes != 0 {
		t.Errorf("with FUA: %d FUA writes, %d flushes; want 1 and 0", s.FUAWrites, s.Flushes)
	}
	m.MaskFlags(client.FlagSendFUA)
	if _, err := m.WriteAtDSync(data, 65536); err != nil {
		t.Fatal(err)
	}
	if s := dev.Stats(); s.FUAWrites != 1 || s.Flushes != 1 || s.Writes != 1 {
		t.Errorf("without FUA: %d FUA writes, %d flushes, %d writes; want 1, 1, 1", s.FUAWrites, s.Flushes, s.Writes)
	}
	if b := dev.Bytes(); !bytes.Equal(b[4096:4096+8192], data) || !bytes.Equal(b[65536:65536+8192], data) {
		t.Error("device does not hold the writes")
	}
	if err := m.Sync(); err != nil || dev.Stats().Flushes != 2 {
		t.Errorf("Sync: %v, %d flushes, want 2", err, dev.Stats().Flushes)
	}
	m.MaskFlags(client.FlagSendFlush) // a server with no cache to flush
	if err := m.Sync(); err != nil || dev.Stats().Flushes != 2 {
		t.Errorf("Sync without FLUSH advertised: %v, %d flushes, want nil and 2", err, dev.Stats().Flushes)
	}
}

// TestTrimZeroes: Trim leaves zeroes: WRITE_ZEROES where advertised, else WRITEs of zeroes;
// never a bare TRIM (whose range the protocol leaves undefined).
func TestTrimZeroes(t *testing.T) {
	dev := nbdtest.NewMemDevice(4 << 20)
	sock := serve(t, nbd.Export{Name: "m", Device: dev})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{})
	if _, err := m.WriteAt(random(4<<20), 0); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	if err := m.Trim(1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if s := dev.Stats(); s.WriteZeroes != 1 || s.Trims != 0 {
		t.Errorf("%d WRITE_ZEROES, %d TRIMs; want 1 and 0", s.WriteZeroes, s.Trims)
	}
	m.MaskFlags(client.FlagSendWriteZeroes)
	writes := dev.Stats().Writes
	if err := m.Trim(3<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if s := dev.Stats(); s.WriteZeroes != 1 || s.Trims != 0 || s.Writes == writes {
		t.Errorf("without WRITE_ZEROES: %d WRITE_ZEROES, %d TRIMs, %d writes; want 1, 0, more", s.WriteZeroes, s.Trims, s.Writes-writes)
	}
	b := dev.Bytes()
	if !bytes.Equal(b[1<<20:2<<20], zero) || !bytes.Equal(b[3<<20:4<<20], zero) {
		t.Error("trimmed ranges do not read as zeroes")
	}
	if bytes.Equal(b[2<<20:2<<20+4096], zero[:4096]) {
		t.Error("range between the trims was zeroed")
	}
}

// TestOpenErrors: a read-only export opened read-write is refused, read-only use is fine;
// an export that cannot be reached is fs.ErrNotExist (a missing member); a minimum block size
// the array cannot meet is refused.
func TestOpenErrors(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	sock := serve(t,
		nbd.Export{Name: "ro", Device: dev, ReadOnly: true},
		nbd.Export{Name: "big", Device: dev, MinBlock: 8192, PreferredBlock: 8192},
	)
	if _, err := nbdmember.Open(uri(sock, "ro"), member.Exclusive, nbdmember.Options{}); !errors.Is(err, nbdmember.ErrReadOnlyExport) {
		t.Errorf("read-only export opened read-write: %v, want ErrReadOnlyExport", err)
	}
	m := open(t, uri(sock, "ro"), member.Inspect, nbdmember.Options{})
	if _, err := m.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Errorf("read of a read-only export: %v", err)
	}
	if _, err := nbdmember.Open(uri(sock, "big"), member.Exclusive, nbdmember.Options{}); !errors.Is(err, nbdmember.ErrBlockSize) {
		t.Errorf("minimum block 8192: %v, want ErrBlockSize", err)
	}
	// A server that closes every connection at once (one starting up, or going down): its
	// member is unreachable too, and raid.Assemble tries it again within its wait.
	closing := filepath.Join(t.TempDir(), "closing.sock")
	ln, err := net.Listen("unix", closing)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, spec := range []string{
		uri(sock, "nosuch"),
		uri(filepath.Join(t.TempDir(), "none.sock"), "m"),
		uri(closing, "m"),
	} {
		if _, err := nbdmember.Open(spec, member.Exclusive, nbdmember.Options{Timeout: 10 * time.Second}); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, nbdmember.ErrUnreachable) {
			t.Errorf("%s: %v, want ErrUnreachable (fs.ErrNotExist)", spec, err)
		}
	}
	// OpenContext gives up when its context ends, as unreachable.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := nbdmember.OpenContext(ctx, uri(sock, "ro"), member.Inspect, nbdmember.Options{}); !errors.Is(err, nbdmember.ErrUnreachable) {
		t.Errorf("OpenContext with its context ended: %v, want ErrUnreachable", err)
	}
	for _, spec := range []string{
		"nbd://host/x?tls-certificates=/d", // TLS files on a plaintext URI
		"nbd+unix:///x",                    // no socket
		"nbds://host/x?tls-certificates=",  // empty DIR
	} {
		if _, err := nbdmember.Open(spec, member.Exclusive, nbdmember.Options{}); !errors.Is(err, client.ErrBadURI) {
			t.Errorf("%s: %v, want client.ErrBadURI", spec, err)
		}
	}
	if _, err := nbdmember.Open("nbds://127.0.0.1:1/x?tls-certificates="+t.TempDir(), member.Exclusive, nbdmember.Options{}); !errors.Is(err, nbdmember.ErrTLSFiles) {
		t.Errorf("tls-certificates DIR without ca-cert.pem: %v, want ErrTLSFiles", err)
	}
}

// tlsSetup makes a PKI and returns it with the options of a server of exports that serves
// only over TLS, with the PKI's server certificate, and wants a client certificate its CA
// signed, and the member options that reach that server (the PKI's CA and client files).
func tlsSetup(t testing.TB, exports ...nbd.Export) (*testpki.PKI, nbd.Options, nbdmember.Options) {
	t.Helper()
	p := testpki.New(t)
	conf, err := nbd.LoadTLSConfig(p.Path(testpki.ServerCert), p.Path(testpki.ServerKey), p.Path(testpki.CACert))
	if err != nil {
		t.Fatal(err)
	}
	return p, nbd.Options{TLSConfig: conf, TLSMode: nbd.TLSRequire, Exports: exports, Logger: quiet},
		nbdmember.Options{TLSCA: p.Path(testpki.CACert), TLSCert: p.Path(testpki.ClientCert), TLSKey: p.Path(testpki.ClientKey)}
}

// TestTLS: an nbds member reaches a TLS-only server that wants a client certificate with the
// files of Options or those of a tls-certificates=DIR query key (Name keeps the key); a
// server whose certificate another CA signed, and a plaintext URI, are refused with errors
// that say so and are not a missing member.
func TestTLS(t *testing.T) {
	p, so, files := tlsSetup(t, nbd.Export{Name: "x", Device: nbdtest.NewMemDevice(1 << 20)})
	srv, err := nbd.NewServer(so)
	if err != nil {
		t.Fatal(err)
	}
	sock, addr := nbdtest.ServeUnix(t, srv), nbdtest.ServeTCP(t, srv)
	data := random(64 << 10)
	for _, tc := range []struct {
		spec string
		opts nbdmember.Options
	}{
		{"nbds+unix:///x?socket=" + sock, files},
		{"nbds://" + addr + "/x", files},
		{"nbds+unix:///x?socket=" + sock + "&tls-certificates=" + p.Dir, nbdmember.Options{}},
	} {
		m := open(t, tc.spec, member.Exclusive, tc.opts)
		if m.Name() != tc.spec {
			t.Errorf("Name %q, want %q", m.Name(), tc.spec)
		}
		got := make([]byte, len(data))
		if _, err := m.WriteAt(data, 4096); err != nil {
			t.Fatalf("%s: WriteAt: %v", tc.spec, err)
		}
		if _, err := m.ReadAt(got, 4096); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read back: %v, equal %v", tc.spec, err, bytes.Equal(got, data))
		}
	}
	other := testpki.New(t)
	_, err = nbdmember.Open("nbds+unix:///x?socket="+sock, member.Exclusive, nbdmember.Options{
		TLSCA: other.Path(testpki.CACert), TLSCert: other.Path(testpki.ClientCert), TLSKey: other.Path(testpki.ClientKey)})
	if !errors.Is(err, client.ErrTLSHandshake) || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("server certificate from another CA: %v, want ErrTLSHandshake, not a missing member", err)
	}
	_, err = nbdmember.Open("nbd+unix:///x?socket="+sock, member.Exclusive, nbdmember.Options{})
	if !errors.Is(err, client.ErrTLSRequired) || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("plaintext URI to a TLS-only server: %v, want ErrTLSRequired, not a missing member", err)
	}
}

// TestVectored: ReadvAt and WritevAt send runs of consecutive buffers as one request each, up
// to the server's maximum block size (a buffer longer than it split), those requests in
// flight at once (the server sees them all before it answers any), every byte where it
// belongs; a failed request gives the bytes of the requests before it and the error.
func TestVectored(t *testing.T) {
	const max = 256 << 10
	dev := nbdtest.NewMemDevice(4 << 20)
	var arrived atomic.Int64
	var want int64
	all := make(chan struct{})
	var once sync.Once
	var barrier atomic.Bool
	dev.Delay = func(op nbdtest.Op, off, n int64) {
		if !barrier.Load() {
			return
		}
		if arrived.Add(1) == want {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(5 * time.Second): // not all in flight: MaxConcurrent says so
		}
	}
	dev.Fail = func(op nbdtest.Op, off, n int64) error {
		if off >= 3<<20 {
			return syscall.EIO
		}
		return nil
	}
	sock := serve(t, nbd.Export{Name: "m", Device: dev, MinBlock: 512, PreferredBlock: 4096, MaxBlock: max})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{})
	// 64 KiB buffers, then one of 320 KiB, then two more of 64 KiB: requests of 4, 4, 1
	// (256 KiB, then 64 KiB: split as ReadAt splits, one after the other) and 2 buffers, so
	// 5 requests, 4 in flight at once.
	sizes := []int{64, 64, 64, 64, 64, 64, 64, 64, 320, 64, 64}
	const requests, together = 5, 4
	total := 0
	for _, k := range sizes {
		total += k << 10
	}
	data := random(total)
	cut := func(p []byte) [][]byte {
		var bufs [][]byte
		for _, k := range sizes {
			bufs, p = append(bufs, p[:k<<10]), p[k<<10:]
		}
		return bufs
	}
	const off = 1 << 20
	want = together
	barrier.Store(true)
	before := dev.Stats()
	if n, err := m.WritevAt(cut(data), off, nil); n != len(data) || err != nil {
		t.Fatalf("WritevAt = %d, %v", n, err)
	}
	barrier.Store(false)
	if w := dev.Stats().Writes - before.Writes; w != requests {
		t.Errorf("WritevAt: %d WRITEs, want %d", w, requests)
	}
	if c := dev.Stats().MaxConcurrent; c != together {
		t.Errorf("WritevAt: at most %d writes in flight at once, want %d", c, together)
	}
	if !bytes.Equal(dev.Bytes()[off:off+len(data)], data) {
		t.Fatal("device does not hold what WritevAt wrote")
	}
	got := make([]byte, len(data))
	before = dev.Stats()
	if n, err := m.ReadvAt(cut(got), off, nil); n != len(got) || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadvAt = %d, %v; equal %v", n, err, bytes.Equal(got, data))
	}
	if r := dev.Stats().Reads - before.Reads; r != requests {
		t.Errorf("ReadvAt: %d READs, want %d", r, requests)
	}
	// The second request (buffers 4-7) falls at 3 MiB, where the device fails.
	n, err := m.ReadvAt(cut(got), 3<<20-max, nil)
	var e *nbdmember.Error
	if n != max || !errors.As(err, &e) {
		t.Errorf("ReadvAt over a failing range = %d, %v; want %d and an *Error", n, err, max)
	}
}
