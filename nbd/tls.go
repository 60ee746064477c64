package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// TLSMode says whether clients may, or must, upgrade to TLS with NBD_OPT_STARTTLS.
type TLSMode int

const (
	// TLSDefault is TLSRequire when Options.TLSConfig is set, else TLSOff.
	TLSDefault TLSMode = iota
	// TLSOff ignores TLSConfig: NBD_OPT_STARTTLS gets NBD_REP_ERR_POLICY (NOTLS mode).
	TLSOff
	// TLSOn admits plaintext clients and those that upgrade (SELECTIVETLS mode, every export
	// available both ways, except exports with AllowedClients, which need a certificate).
	TLSOn
	// TLSRequire answers every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT with
	// NBD_REP_ERR_TLS_REQD until the client has upgraded, and closes the connection on an
	// NBD_OPT_EXPORT_NAME before it (FORCEDTLS mode).
	TLSRequire
)

// ParseTLSMode parses "off", "on" or "require" (for command-line flags). It returns
// ErrInvalidOptions for anything else.
func ParseTLSMode(s string) (TLSMode, error) {
	switch s {
	case "off":
		return TLSOff, nil
	case "on":
		return TLSOn, nil
	case "require":
		return TLSRequire, nil
	}
	return TLSDefault, fmt.Errorf("%w: TLS mode %q is not off, on or require", ErrInvalidOptions, s)
}

func (m TLSMode) String() string {
	switch m {
	case TLSDefault:
		return "default"
	case TLSOff:
		return "off"
	case TLSOn:
		return "on"
	case TLSRequire:
		return "require"
	}
	return fmt.Sprintf("TLSMode(%d)", int(m))
}

// LoadTLSConfig builds a server TLS configuration from PEM files: the server's certificate
// chain and its key, and, when clientCAFile is not empty, the CAs that sign client
// certificates, which are then required and verified (mutual TLS; Export.AllowedClients names
// them). TLS 1.2 is the oldest version accepted. Errors wrap ErrTLSConfig.
func LoadTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTLSConfig, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrTLSConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: no PEM certificate in %s", ErrTLSConfig, clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// verifiesClients reports whether cfg makes the client certificates it accepts trustworthy:
// only then may their names grant access to an export.
func verifiesClients(cfg *tls.Config) bool {
	return cfg != nil && (cfg.ClientAuth == tls.RequireAndVerifyClientCert ||
		cfg.ClientAuth == tls.VerifyClientCertIfGiven)
}

// peer is who the client is, as far as the server can tell; access checks use it.
type peer struct {
	tls       bool     // the connection has been upgraded to TLS
	certNames []string // CN and DNS SANs of a verified client certificate
	uid       int      // unix socket peer's uid (SO_PEERCRED), when hasUID
	hasUID    bool
}

func (p *peer) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tls=%v", p.tls)
	if len(p.certNames) > 0 {
		fmt.Fprintf(&b, " cert=%s", strings.Join(p.certNames, ","))
	}
	if p.hasUID {
		fmt.Fprintf(&b, " uid=%d", p.uid)
	}
	return b.String()
}

// allowed reports whether p may use e: always when e has no allow-list, otherwise when a
// verified certificate name is in AllowedClients or the unix peer's uid in AllowedUIDs.
func (e *Export) allowed(p *peer) bool {
	if len(e.AllowedClients) == 0 && len(e.AllowedUIDs) == 0 {
		return true
	}
	for _, n := range p.certNames {
		if slices.Contains(e.AllowedClients, n) {
			return true
		}
	}
	return p.hasUID && slices.Contains(e.AllowedUIDs, p.uid)
}

// certNames returns the subject CN and DNS SANs of the verified client certificate, if any.
func certNames(cs tls.ConnectionState) []string {
	if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return nil
	}
	leaf := cs.PeerCertificates[0]
	var names []string
	if leaf.Subject.CommonName != "" {
		names = append(names, leaf.Subject.CommonName)
	}
	return append(names, leaf.DNSNames...)
}

// unixPeer fills in the uid of a unix socket peer (SO_PEERCRED); other connections are left
// alone.
func unixPeer(nc net.Conn, p *peer) {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err == nil {
			p.uid, p.hasUID = int(cred.Uid), true
		}
	})
}

// bufferedConn reads through the handshake's bufio.Reader, so that bytes it already holds
// (a TLS ClientHello sent right behind the STARTTLS) are not lost; writes go straight out.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// startTLS is the handshakeConn.upgrade of a real connection: it runs the TLS handshake on c
// (the caller has sent NBD_REP_ACK) and switches c's reader and writer to the TLS session.
// A failed TLS handshake wraps ErrTLSHandshake; the connection must close.
func (c *conn) startTLS(ctx context.Context, h *handshakeConn) error {
	var under net.Conn = c.nc
	if c.br.Buffered() > 0 {
		under = bufferedConn{c.nc, c.br}
	}
	tc := tls.Server(under, c.srv.tlsConfig)
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrTLSHandshake, err) // a timeout stays a net.Error
	}
	c.nc = tc
	c.br = bufio.NewReaderSize(tc, 64<<10)
	h.r, h.w = c.br, tc
	h.peer.tls = true
	h.peer.certNames = certNames(tc.ConnectionState())
	return nil
}
