package test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raid5d/raid5d/internal/testpki"
)

// TestTLS serves with --tls-cert/--tls-key/--tls-client-ca (TLS required by default) and
// checks, with nbdinfo: a client with a certificate gets the export over TLS; a plaintext
// client and a TLS client without a certificate are refused; the daemon keeps serving.
func TestTLS(t *testing.T) {
	need(t, "nbdinfo")
	if standin {
		t.Skip("raid5d's TLS flags")
	}
	pki := testpki.New(t)
	certs := pki.Dir
	noCert := pki.CAOnlyDir(t) // a TLS client without a certificate of its own
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
	certs := testpki.New(t).Dir
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
