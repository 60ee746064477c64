package test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCerts makes a CA, a server certificate (localhost, 127.0.0.1) and a client certificate
// named client, in the layout libnbd's tls-certificates=DIR expects (ca-cert.pem,
// client-cert.pem, client-key.pem) plus server-cert.pem and server-key.pem.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	caKey := newKey()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "raid5d test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write("ca-cert.pem", "CERTIFICATE", caDER)
	for i, who := range []string{"server", "client"} {
		k := newKey()
		c := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: who},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, c, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		write(who+"-cert.pem", "CERTIFICATE", der)
		write(who+"-key.pem", "PRIVATE KEY", kder)
	}
}

// TestTLS serves with --tls-cert/--tls-key/--tls-client-ca (TLS required by default) and
// checks, with nbdinfo: a client with a certificate gets the export over TLS; a plaintext
// client and a TLS client without a certificate are refused; the daemon keeps serving.
func TestTLS(t *testing.T) {
	need(t, "nbdinfo")
	if standin {
		t.Skip("raid5d's TLS flags")
	}
	certs := t.TempDir()
	writeCerts(t, certs)
	noCert := t.TempDir() // the CA only: a TLS client without a certificate of its own
	ca, err := os.ReadFile(filepath.Join(certs, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(noCert, "ca-cert.pem"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	a := newArray(t)
	s := a.serve(t, "--tls-cert", filepath.Join(certs, "server-cert.pem"), "--tls-key", filepath.Join(certs, "server-key.pem"),
		"--tls-client-ca", filepath.Join(certs, "ca-cert.pem"))

	tlsURI := func(dir string) string {
		return "nbds+unix:///?socket=" + s.sock + "&tls-certificates=" + dir
	}
	out := runTool(t, "nbdinfo", "--json", tlsURI(certs))
	var info struct {
		Exports []struct {
			Size int64 `json:"export-size"`
		} `json:"exports"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Exports) != 1 || info.Exports[0].Size != arraySize {
		t.Fatalf("nbdinfo over TLS: %v\n%s", err, out)
	}
	if out, err := runToolErr("nbdinfo", "--size", s.uri); err == nil {
		t.Errorf("a plaintext client was served by a TLS-only daemon: %s", out)
	}
	if out, err := runToolErr("nbdinfo", "--size", tlsURI(noCert)); err == nil {
		t.Errorf("a TLS client without a certificate was served although one is required: %s", out)
	}
	// Still serving the good client.
	if out := runTool(t, "nbdinfo", "--size", tlsURI(certs)); strings.TrimSpace(out) != "198180864" {
		t.Errorf("nbdinfo --size after the refusals: %q", out)
	}
}

// TestBenchTLS drives a TLS-only raid5d (serve --tls require, client certificates required)
// with raid5d bench --verify over an nbds+unix URI, with the CA and a client certificate: every
// byte written is read back and checked. Without TLS, bench is refused with the hint.
func TestBenchTLS(t *testing.T) {
	needRaid5d(t)
	certs := t.TempDir()
	writeCerts(t, certs)
	a := newArray(t)
	s := a.serve(t, "--tls", "require", "--tls-cert", filepath.Join(certs, "server-cert.pem"), "--tls-key", filepath.Join(certs, "server-key.pem"),
		"--tls-client-ca", filepath.Join(certs, "ca-cert.pem"))
	out := runTool(t, raid5dBin, "bench", "nbds+unix:///?socket="+s.sock, "--tls-ca", filepath.Join(certs, "ca-cert.pem"),
		"--tls-cert", filepath.Join(certs, "client-cert.pem"), "--tls-key", filepath.Join(certs, "client-key.pem"),
		"--rw", "randwrite", "--bs", "64K", "--size", "8M", "--time", "0", "--verify", "--jobs", "2")
	if !strings.Contains(out, "; 0 mismatches") || !strings.Contains(out, "errors: 0") {
		t.Errorf("bench --verify over TLS:\n%s", out)
	}
	out, err := runToolErr(raid5dBin, "bench", s.uri, "--time", "0", "--size", "1M")
	if err == nil || !strings.Contains(out, "server requires TLS; use nbds://") {
		t.Errorf("plaintext bench against a TLS-only daemon: %v\n%s", err, out)
	}
}
