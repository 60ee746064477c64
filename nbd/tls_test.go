package nbd

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/testpki"
	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// serverConfig loads the server's configuration from p's PEM files, as the daemon would,
// verifying client certificates when mutual.
func serverConfig(t *testing.T, p *testpki.PKI, mutual bool) *tls.Config {
	t.Helper()
	ca := ""
	if mutual {
		ca = p.Path(testpki.CACert)
	}
	cfg, err := LoadTLSConfig(p.Path(testpki.ServerCert), p.Path(testpki.ServerKey), ca)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// startTLS sends NBD_OPT_STARTTLS, expects the ACK and runs the TLS handshake; it returns the
// handshake's error (with TLS 1.3, a refused client certificate shows only on the first read).
func (c *rawClient) startTLS(cfg *tls.Config) error {
	c.t.Helper()
	c.option(wire.OptStartTLS, nil)
	if r := c.optionReply(); r.id != wire.OptStartTLS || r.typ != wire.RepAck {
		c.t.Fatalf("STARTTLS reply (%d, %#x), want ACK", r.id, r.typ)
	}
	tc := tls.Client(c.nc, cfg)
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	if err := tc.Handshake(); err != nil {
		return err
	}
	c.nc, c.r = tc, bufio.NewReader(tc)
	return nil
}

// tlsExports: "disk" for anyone, "alice" for alice's certificate only.
func tlsExports() (Options, *nbdtest.MemDevice) {
	mem := nbdtest.NewMemDevice(testSize)
	return Options{Exports: []Export{
		{Name: "disk", Device: mem},
		{Name: "alice", Device: nbdtest.NewMemDevice(testSize), AllowedClients: []string{"alice"}},
	}}, mem
}

func TestTLSRequire(t *testing.T) {
	pki := testpki.New(t)
	newServer := func(t *testing.T) (*Server, *logStore) {
		opts, _ := tlsExports()
		opts.TLSConfig = serverConfig(t, pki, true) // TLSDefault with a config: require
		return testServer(t, opts)
	}
	t.Run("options before STARTTLS", func(t *testing.T) {
		s, _ := newServer(t)
		c, _ := unixConn(t, s)
		c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
		for _, tt := range []struct {
			name string
			id   uint32
			data []byte
			want uint32
		}{
			{"LIST", wire.OptList, nil, wire.RepErrTLSReqd},
			{"INFO", wire.OptInfo, infoData("disk"), wire.RepErrTLSReqd},
			{"GO", wire.OptGo, infoData("disk"), wire.RepErrTLSReqd},
			{"STRUCTURED_REPLY", wire.OptStructuredReply, nil, wire.RepErrTLSReqd},
			{"unknown", 0x4242, []byte("junk"), wire.RepErrTLSReqd},
			{"STARTTLS with data", wire.OptStartTLS, []byte("x"), wire.RepErrInvalid},
		} {
			c.option(tt.id, tt.data)
			if r := c.optionReply(); r.id != tt.id || r.typ != tt.want {
				t.Errorf("%s: reply (%d, %#x), want (%d, %#x)", tt.name, r.id, r.typ, tt.id, tt.want)
			}
		}
		if err := c.startTLS(pki.ClientConfig(&pki.Alice)); err != nil {
			t.Fatal(err)
		}
		c.option(wire.OptStartTLS, nil)
		if r := c.optionReply(); r.typ != wire.RepErrInvalid {
			t.Errorf("second STARTTLS: reply %#x, want ERR_INVALID", r.typ)
		}
		c.option(wire.OptList, nil)
		n := 0
		for r := c.optionReply(); r.typ != wire.RepAck; r = c.optionReply() {
			if r.typ != wire.RepServer {
				t.Fatalf("LIST after TLS: reply %#x", r.typ)
			}
			n++
		}
		if n != 2 {
			t.Errorf("LIST after TLS as alice: %d exports, want 2", n)
		}
		c.option(wire.OptGo, infoData("alice"))
		if _, final := c.infoReplies(wire.OptGo); final != wire.RepAck {
			t.Fatalf("GO alice as alice: %#x", final)
		}
		p := pattern(1, 8192)
		if errno, _ := c.do(wire.CmdWrite, 0, 4096, 8192, p); errno != 0 {
			t.Fatal(errno)
		}
		if errno, got := c.do(wire.CmdRead, 0, 4096, 8192, nil); errno != 0 || !bytes.Equal(got, p) {
			t.Fatalf("read back over TLS: errno %d, equal %v", errno, bytes.Equal(got, p))
		}
	})
	t.Run("bob is refused alice's export", func(t *testing.T) {
		s, logs := newServer(t)
		c, done := unixConn(t, s)
		c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
		if err := c.startTLS(pki.ClientConfig(&pki.Bob)); err != nil {
			t.Fatal(err)
		}
		c.option(wire.OptInfo, infoData("alice"))
		if _, final := c.infoReplies(wire.OptInfo); final != wire.RepErrPolicy {
			t.Errorf("INFO alice as bob: %#x, want ERR_POLICY", final)
		}
		c.option(wire.OptGo, infoData("disk"))
		if _, final := c.infoReplies(wire.OptGo); final != wire.RepAck {
			t.Fatalf("GO disk as bob: %#x", final)
		}
		c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
		<-done

		c, done = unixConn(t, s)
		c.greet(wire.FlagCFixedNewstyle)
		if err := c.startTLS(pki.ClientConfig(&pki.Bob)); err != nil {
			t.Fatal(err)
		}
		c.option(wire.OptExportName, []byte("alice"))
		c.expectClosed()
		<-done
		if !logs.loggedErr(ErrAccessDenied) {
			t.Error("no log line with ErrAccessDenied")
		}
	})
	t.Run("EXPORT_NAME before STARTTLS closes", func(t *testing.T) {
		s, logs := newServer(t)
		c, done := unixConn(t, s)
		c.greet(wire.FlagCFixedNewstyle)
		c.option(wire.OptExportName, []byte("disk"))
		c.expectClosed()
		<-done
		if !logs.loggedErr(ErrTLSRequired) {
			t.Error("no log line with ErrTLSRequired")
		}
	})
	for _, tt := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"client without a certificate", pki.ClientConfig(nil)},
		{"client certificate from another CA", func() *tls.Config {
			other := testpki.New(t)
			cfg := pki.ClientConfig(&other.Alice)
			return cfg
		}()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, logs := newServer(t)
			c, done := unixConn(t, s)
			c.greet(wire.FlagCFixedNewstyle)
			if err := c.startTLS(tt.cfg); err == nil {
				// TLS 1.3: the client learns of the refusal on its first read (or its write
				// fails: the server may have closed already).
				c.nc.Write(optionBytes(wire.OptList, nil))
				var b [1]byte
				if _, err := c.r.Read(b[:]); err == nil {
					t.Fatal("server answered a client without a valid certificate")
				}
			}
			<-done
			if !logs.loggedErr(ErrTLSHandshake) {
				t.Error("no log line with ErrTLSHandshake")
			}
		})
	}
}

func TestTLSOn(t *testing.T) {
	pki := testpki.New(t)
	opts, mem := tlsExports()
	opts.TLSConfig, opts.TLSMode = serverConfig(t, pki, false), TLSOn
	opts.TLSConfig.ClientAuth, opts.TLSConfig.ClientCAs = tls.VerifyClientCertIfGiven, pki.CAPool
	s, _ := testServer(t, opts)

	// Plaintext: the open export works, the one that needs a certificate asks for TLS.
	c, done := unixConn(t, s)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	c.option(wire.OptGo, infoData("alice"))
	if _, final := c.infoReplies(wire.OptGo); final != wire.RepErrTLSReqd {
		t.Errorf("GO alice in plaintext: %#x, want ERR_TLS_REQD", final)
	}
	c.option(wire.OptList, nil)
	if r := c.optionReply(); r.typ != wire.RepServer || string(r.data[4:8]) != "disk" {
		t.Errorf("LIST in plaintext: %#x %q, want disk only", r.typ, r.data)
	}
	if r := c.optionReply(); r.typ != wire.RepAck {
		t.Errorf("LIST in plaintext lists more than disk: %#x %q", r.typ, r.data)
	}
	c.option(wire.OptGo, infoData("disk"))
	if _, final := c.infoReplies(wire.OptGo); final != wire.RepAck {
		t.Fatalf("GO disk in plaintext: %#x", final)
	}
	p := pattern(2, 4096)
	if errno, _ := c.do(wire.CmdWrite, 0, 0, 4096, p); errno != 0 {
		t.Fatal(errno)
	}
	c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
	<-done
	if !bytes.Equal(mem.Bytes()[:4096], p) {
		t.Error("plaintext write did not reach the device")
	}

	// TLS without a certificate (allowed: VerifyClientCertIfGiven) reaches disk, not alice.
	c, done = unixConn(t, s)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := c.startTLS(pki.ClientConfig(nil)); err != nil {
		t.Fatal(err)
	}
	c.option(wire.OptInfo, infoData("alice"))
	if _, final := c.infoReplies(wire.OptInfo); final != wire.RepErrPolicy {
		t.Errorf("INFO alice over TLS without a certificate: %#x, want ERR_POLICY", final)
	}
	c.option(wire.OptGo, infoData("disk"))
	if _, final := c.infoReplies(wire.OptGo); final != wire.RepAck {
		t.Fatalf("GO disk over TLS: %#x", final)
	}
	if errno, got := c.do(wire.CmdRead, 0, 0, 4096, nil); errno != 0 || !bytes.Equal(got, p) {
		t.Fatalf("read over TLS: errno %d", errno)
	}
	c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
	<-done
}

func TestTLSOff(t *testing.T) {
	pki := testpki.New(t)
	s, _ := testServer(t, Options{Exports: []Export{{Device: nbdtest.NewMemDevice(testSize)}},
		TLSConfig: serverConfig(t, pki, false), TLSMode: TLSOff})
	c, _ := pipe(t, s)
	c.greet(wire.FlagCFixedNewstyle)
	c.option(wire.OptStartTLS, nil)
	if r := c.optionReply(); r.typ != wire.RepErrUnsup {
		t.Errorf("STARTTLS with TLS off: %#x, want ERR_UNSUP", r.typ)
	}
	c.handshakeGoAfterGreet("")
}

// handshakeGoAfterGreet enters transmission with NBD_OPT_GO on a greeted connection.
func (c *rawClient) handshakeGoAfterGreet(name string) {
	c.t.Helper()
	c.option(wire.OptGo, infoData(name))
	if _, final := c.infoReplies(wire.OptGo); final != wire.RepAck {
		c.t.Fatalf("NBD_OPT_GO %q: final reply %#x", name, final)
	}
}

func TestAllowedUIDs(t *testing.T) {
	uid := os.Getuid()
	s, logs := testServer(t, Options{Exports: []Export{
		{Name: "mine", Device: nbdtest.NewMemDevice(testSize), AllowedUIDs: []int{uid}},
		{Name: "theirs", Device: nbdtest.NewMemDevice(testSize), AllowedUIDs: []int{uid + 1}},
	}})
	t.Run("unix socket", func(t *testing.T) {
		c, _ := unixConn(t, s)
		c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
		c.option(wire.OptInfo, infoData("theirs"))
		if _, final := c.infoReplies(wire.OptInfo); final != wire.RepErrPolicy {
			t.Errorf("INFO theirs: %#x, want ERR_POLICY", final)
		}
		c.handshakeGoAfterGreet("mine")
	})
	t.Run("EXPORT_NAME denied closes", func(t *testing.T) {
		c, done := unixConn(t, s)
		c.greet(wire.FlagCFixedNewstyle)
		c.option(wire.OptExportName, []byte("theirs"))
		c.expectClosed()
		<-done
		if !logs.loggedErr(ErrAccessDenied) {
			t.Error("no log line with ErrAccessDenied")
		}
	})
	t.Run("TCP has no uid", func(t *testing.T) {
		nc, err := net.Dial("tcp", nbdtest.ServeTCP(t, s))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		c := newRawClient(t, nc)
		c.greet(wire.FlagCFixedNewstyle)
		c.option(wire.OptGo, infoData("mine"))
		if _, final := c.infoReplies(wire.OptGo); final != wire.RepErrPolicy {
			t.Errorf("GO mine over TCP: %#x, want ERR_POLICY", final)
		}
	})
}

func TestTLSOptionsValidation(t *testing.T) {
	pki := testpki.New(t)
	dev := nbdtest.NewMemDevice(4096)
	plain := serverConfig(t, pki, false)
	mutual := serverConfig(t, pki, true)
	for _, tt := range []struct {
		name string
		opts Options
		want error
		mode TLSMode
	}{
		{"require without config", Options{TLSMode: TLSRequire}, ErrInvalidOptions, 0},
		{"on without config", Options{TLSMode: TLSOn}, ErrInvalidOptions, 0},
		{"unknown mode", Options{TLSMode: 42, TLSConfig: plain}, ErrInvalidOptions, 0},
		{"AllowedClients without TLS", Options{Exports: []Export{{Device: dev, AllowedClients: []string{"a"}}}}, ErrInvalidExport, 0},
		{"AllowedClients without verification", Options{TLSConfig: plain,
			Exports: []Export{{Device: dev, AllowedClients: []string{"a"}}}}, ErrInvalidExport, 0},
		{"AllowedClients with TLS off", Options{TLSConfig: mutual, TLSMode: TLSOff,
			Exports: []Export{{Device: dev, AllowedClients: []string{"a"}}}}, ErrInvalidExport, 0},
		{"negative timeout", Options{HandshakeTimeout: -1}, ErrInvalidOptions, 0},
		{"negative connections", Options{MaxConnections: -1}, ErrInvalidOptions, 0},
		{"no TLS", Options{}, nil, TLSOff},
		{"config means require", Options{TLSConfig: plain}, nil, TLSRequire},
		{"config and off", Options{TLSConfig: plain, TLSMode: TLSOff}, nil, TLSOff},
		{"on", Options{TLSConfig: plain, TLSMode: TLSOn}, nil, TLSOn},
		{"mutual with AllowedClients", Options{TLSConfig: mutual,
			Exports: []Export{{Device: dev, AllowedClients: []string{"a"}}}}, nil, TLSRequire},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.opts.Exports == nil {
				tt.opts.Exports = []Export{{Device: dev}}
			}
			s, err := NewServer(tt.opts)
			if !errors.Is(err, tt.want) {
				t.Fatalf("NewServer: %v, want %v", err, tt.want)
			}
			if err == nil && s.tlsMode != tt.mode {
				t.Errorf("mode %v, want %v", s.tlsMode, tt.mode)
			}
		})
	}
	s, _ := NewServer(Options{Exports: []Export{{Device: dev}}, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS10}})
	if s.tlsConfig.MinVersion != tls.VersionTLS12 {
		t.Errorf("MinVersion %#x, want TLS 1.2", s.tlsConfig.MinVersion)
	}
	for _, m := range []string{"off", "on", "require"} {
		if got, err := ParseTLSMode(m); err != nil || got.String() != m {
			t.Errorf("ParseTLSMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseTLSMode("yes"); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("ParseTLSMode(yes) = %v, want ErrInvalidOptions", err)
	}
	f := pki.Path
	if cfg := mutual; cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.ClientCAs == nil || len(cfg.Certificates) != 1 {
		t.Errorf("LoadTLSConfig with a client CA: %+v", cfg)
	}
	for _, files := range [][3]string{
		{f("nope.pem"), f("server-key.pem"), ""},
		{f("server-cert.pem"), f("client-key.pem"), ""},
		{f("server-cert.pem"), f("server-key.pem"), f("nope.pem")},
		{f("server-cert.pem"), f("server-key.pem"), f("server-key.pem")},
	} {
		if _, err := LoadTLSConfig(files[0], files[1], files[2]); !errors.Is(err, ErrTLSConfig) {
			t.Errorf("LoadTLSConfig(%q) = %v, want ErrTLSConfig", files, err)
		}
	}
}
