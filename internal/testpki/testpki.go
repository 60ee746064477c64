// Package testpki makes a throwaway certificate authority for tests: a CA, a server certificate
// for localhost and 127.0.0.1, and two client certificates, "alice" and "bob", in memory and
// (the CA, the server and alice) as PEM files in the layout libnbd's tls-certificates=DIR and
// qemu read. It is for tests only: keys are fresh ECDSA P-256 keys, certificates are valid
// from an hour ago for a day.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The PEM files New writes into PKI.Dir.
const (
	CACert     = "ca-cert.pem"     // the CA's certificate
	ServerCert = "server-cert.pem" // the server's certificate (localhost, 127.0.0.1)
	ServerKey  = "server-key.pem"  // its key (PKCS #8)
	ClientCert = "client-cert.pem" // alice's certificate
	ClientKey  = "client-key.pem"  // alice's key (PKCS #8)
)

// PKI is a CA and the certificates it signed.
type PKI struct {
	// Dir holds the PEM files (CACert, ServerCert, ServerKey, ClientCert, ClientKey), 0600.
	Dir string
	// CAPool holds the CA's certificate, to verify the others.
	CAPool *x509.CertPool
	// Server is for localhost and 127.0.0.1 (ExtKeyUsageServerAuth); Alice and Bob are client
	// certificates (ExtKeyUsageClientAuth) with those common names.
	Server, Alice, Bob tls.Certificate
}

// New makes a CA and its certificates and writes the PEM files into a fresh t.TempDir. Two
// calls make two unrelated CAs.
func New(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir(), CAPool: x509.NewCertPool()}
	now := time.Now()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "raid5d test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	ca := sign(t, caTmpl, caTmpl, caKey, caKey)
	p.CAPool.AddCert(ca)
	p.writePEM(t, CACert, "CERTIFICATE", ca.Raw)

	serial := int64(1)
	issue := func(cn string, usage x509.ExtKeyUsage, certFile, keyFile string) tls.Certificate {
		k := newKey(t)
		serial++
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		der := sign(t, tmpl, ca, k, caKey).Raw
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		if certFile != "" {
			p.writePEM(t, certFile, "CERTIFICATE", der)
			p.writePEM(t, keyFile, "PRIVATE KEY", kder)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	p.Server = issue("localhost", x509.ExtKeyUsageServerAuth, ServerCert, ServerKey)
	p.Alice = issue("alice", x509.ExtKeyUsageClientAuth, ClientCert, ClientKey)
	p.Bob = issue("bob", x509.ExtKeyUsageClientAuth, "", "")
	return p
}

// Path returns the path of one of the PEM files in Dir (CACert, ServerCert, ...).
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// ClientConfig is a client configuration that trusts the CA and expects the server to be
// localhost, presenting cert if it is not nil.
func (p *PKI) ClientConfig(cert *tls.Certificate) *tls.Config {
	cfg := &tls.Config{RootCAs: p.CAPool, ServerName: "localhost"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// CAOnlyDir returns a fresh directory holding only the CA's certificate: libnbd's
// tls-certificates=DIR for a TLS client without a certificate of its own.
func (p *PKI) CAOnlyDir(t testing.TB) string {
	t.Helper()
	ca, err := os.ReadFile(p.Path(CACert))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CACert), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (p *PKI) writePEM(t testing.TB, name, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(p.Path(name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// sign makes the certificate tmpl for key, signed by parent's parentKey (self-signed when
// parent is tmpl).
func sign(t testing.TB, tmpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
