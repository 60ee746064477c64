package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/testpki"
	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// serveTLS runs an nbd.Server with one export "x" on a unix socket and on a loopback TCP port,
// with the PKI's server certificate, client certificates required (mutual TLS) when mutual,
// and the given mode. It returns the socket path and the TCP address.
func serveTLS(t *testing.T, p *testpki.PKI, mode nbd.TLSMode, mutual bool, dev nbd.Device) (sock, addr string) {
	t.Helper()
	clientCA := ""
	if mutual {
		clientCA = p.Path(testpki.CACert)
	}
	conf, err := nbd.LoadTLSConfig(p.Path(testpki.ServerCert), p.Path(testpki.ServerKey), clientCA)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := nbd.NewServer(nbd.Options{
		TLSConfig: conf, TLSMode: mode,
		Exports: []nbd.Export{{Name: "x", Device: dev}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return nbdtest.ServeUnix(t, srv), nbdtest.ServeTCP(t, srv)
}

func dialTLS(uri string, conf *tls.Config) (*client.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return client.Dial(ctx, uri, client.Options{TLSConfig: conf})
}

// roundTrip writes a random 64 KiB at 4 KiB and reads it back through c, comparing every byte.
func roundTrip(t *testing.T, c *client.Conn) {
	t.Helper()
	want := make([]byte, 64<<10)
	rand.Read(want)
	if _, err := c.WriteAt(want, 4096); err != nil {
		t.Fatalf("WriteAt: %v", err)
	}
	got := make([]byte, len(want))
	if _, err := c.ReadAt(got, 4096); err != nil {
		t.Fatalf("ReadAt: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs from what was written")
	}
}

// TestTLSMutual: a TLS-only server with client certificates required serves a client with the
// CA and a certificate, over a unix socket (server name localhost) and TCP (the URI's
// 127.0.0.1); it refuses a plaintext client with ErrTLSRequired, a client without a
// certificate, and a client that does not trust the server's CA.
func TestTLSMutual(t *testing.T) {
	p := testpki.New(t)
	sock, addr := serveTLS(t, p, nbd.TLSRequire, true, nbdtest.NewMemDevice(1<<20))
	good, err := client.LoadTLSConfig(p.Path(testpki.CACert), p.Path(testpki.ClientCert), p.Path(testpki.ClientKey), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, uri := range []string{"nbds+unix:///x?socket=" + sock, "nbds://" + addr + "/x"} {
		c, err := dialTLS(uri, good)
		if err != nil {
			t.Fatalf("Dial %s: %v", uri, err)
		}
		roundTrip(t, c)
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if good.ServerName != "" {
		t.Error("Dial changed the caller's TLS config (ServerName)")
	}

	_, err = dialTLS("nbd+unix:///x?socket="+sock, nil)
	if !errors.Is(err, client.ErrTLSRequired) {
		t.Errorf("plaintext client: err = %v, want ErrTLSRequired", err)
	}
	noCert, err := client.LoadTLSConfig(p.Path(testpki.CACert), "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := dialTLS("nbds+unix:///x?socket="+sock, noCert); err == nil {
		c.Close()
		t.Error("a client without a certificate was served although the server requires one")
	}
	wrongCA, err := client.LoadTLSConfig(testpki.New(t).Path(testpki.CACert), p.Path(testpki.ClientCert), p.Path(testpki.ClientKey), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialTLS("nbds+unix:///x?socket="+sock, wrongCA); !errors.Is(err, client.ErrTLSHandshake) {
		t.Errorf("server certificate from an untrusted CA: err = %v, want ErrTLSHandshake", err)
	}
	wrongName, err := client.LoadTLSConfig(p.Path(testpki.CACert), p.Path(testpki.ClientCert), p.Path(testpki.ClientKey), "not-the-server")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialTLS("nbds+unix:///x?socket="+sock, wrongName); !errors.Is(err, client.ErrTLSHandshake) {
		t.Errorf("server certificate for another name: err = %v, want ErrTLSHandshake", err)
	}
}

// TestTLSModes: a server with TLS on serves plaintext and TLS clients alike; one with TLS off
// refuses NBD_OPT_STARTTLS, which Dial reports as an *OptionError for it.
func TestTLSModes(t *testing.T) {
	p := testpki.New(t)
	conf, err := client.LoadTLSConfig(p.Path(testpki.CACert), "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	sock, _ := serveTLS(t, p, nbd.TLSOn, false, nbdtest.NewMemDevice(1<<20))
	for uri, cc := range map[string]*tls.Config{"nbd+unix:///x?socket=" + sock: nil, "nbds+unix:///x?socket=" + sock: conf} {
		c, err := dialTLS(uri, cc)
		if err != nil {
			t.Fatalf("TLS on: Dial %s: %v", uri, err)
		}
		roundTrip(t, c)
		c.Close()
	}
	offSock, _ := serveTLS(t, p, nbd.TLSOff, false, nbdtest.NewMemDevice(1<<20))
	_, err = dialTLS("nbds+unix:///x?socket="+offSock, conf)
	var oe *client.OptionError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "NBD_OPT_STARTTLS") {
		t.Fatalf("TLS off: err = %v, want an *OptionError for NBD_OPT_STARTTLS", err)
	}
	if _, err := dialTLS("nbd+unix:///x?socket="+offSock, conf); !errors.Is(err, client.ErrBadURI) {
		t.Errorf("a TLS config with a plaintext URI: err = %v, want ErrBadURI", err)
	}
}

// recordingConn keeps a copy of every byte written through it.
type recordingConn struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.out.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

// TestTLSEncrypts: after STARTTLS the data really goes over TLS: a recognisable block written
// through the client never appears on the socket in the clear (it does without TLS, which
// shows the check can fail).
func TestTLSEncrypts(t *testing.T) {
	p := testpki.New(t)
	sock, _ := serveTLS(t, p, nbd.TLSOn, false, nbdtest.NewMemDevice(1<<20))
	conf, err := client.LoadTLSConfig(p.Path(testpki.CACert), "", "", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte("raid5d plaintext marker 0123456789abcdefghijklmnopqrstuvwxyz!!!\n"), 64) // 4 KiB
	for _, withTLS := range []bool{false, true} {
		nc, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		rc := &recordingConn{Conn: nc}
		opts := client.Options{}
		if withTLS {
			opts.TLSConfig = conf
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := client.NewConn(ctx, rc, "x", opts)
		cancel()
		if err != nil {
			nc.Close()
			t.Fatalf("NewConn (TLS %v): %v", withTLS, err)
		}
		if _, err := c.WriteAt(secret, 0); err != nil {
			t.Fatal(err)
		}
		c.Close()
		rc.mu.Lock()
		seen := bytes.Contains(rc.out.Bytes(), secret[:64])
		rc.mu.Unlock()
		if seen == withTLS {
			t.Errorf("TLS %v: the written data was seen in the clear on the socket: %v", withTLS, seen)
		}
	}
}
