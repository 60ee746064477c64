package nbd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/testpki"
)

// runErr runs a tool and returns its combined output and error, within a minute.
func runErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// TestNbdinfoTLS: nbdinfo over nbds+unix with alice's certificate sees the exports; without a
// certificate, or in plaintext, it is refused by a server that requires both.
func TestNbdinfoTLS(t *testing.T) {
	need(t, "nbdinfo")
	pki := testpki.New(t)
	opts, _ := tlsExports()
	opts.TLSConfig = serverConfig(t, pki, true)
	_, logs, path := serveUnix(t, opts)

	out := run(t, "nbdinfo", "--json", "nbds+unix:///alice?socket="+path+"&tls-certificates="+pki.Dir)
	if !strings.Contains(out, fmt.Sprintf(`"export-size": %d`, testSize)) || !strings.Contains(out, `"TLS": true`) {
		t.Errorf("nbdinfo over TLS:\n%s", out)
	}
	out = run(t, "nbdinfo", "--list", "nbds+unix:///?socket="+path+"&tls-certificates="+pki.Dir)
	if !strings.Contains(out, "export=\"disk\"") || !strings.Contains(out, "export=\"alice\"") {
		t.Errorf("nbdinfo --list over TLS as alice does not show both exports:\n%s", out)
	}

	t.Run("no client certificate", func(t *testing.T) {
		out, err := runErr("nbdinfo", "nbds+unix:///disk?socket="+path+"&tls-certificates="+pki.CAOnlyDir(t))
		if err == nil {
			t.Fatalf("nbdinfo without a client certificate succeeded:\n%s", out)
		}
		// Serve logs the refusal before the next connection is served; nbdinfo has exited.
		for deadline := time.Now().Add(10 * time.Second); !logs.loggedErr(ErrTLSHandshake); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no log line with ErrTLSHandshake; nbdinfo said:\n%s", out)
			}
		}
	})
	t.Run("plaintext", func(t *testing.T) {
		// libnbd 1.14 reports NBD_REP_ERR_TLS_REQD as "Operation not supported"; the server's
		// message for it shows in libnbd's debug output.
		cmd := exec.Command("nbdinfo", "nbd+unix:///disk?socket="+path)
		cmd.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("plaintext nbdinfo succeeded against a TLS-only server:\n%s", out)
		}
		if !strings.Contains(string(out), "server error message: TLS is required") {
			t.Errorf("nbdinfo did not get the TLS-required error:\n%s", out)
		}
	})
}

// TestQemuIOTLS writes and reads patterns with qemu-io over TLS with a client certificate and
// compares the device's bytes.
func TestQemuIOTLS(t *testing.T) {
	need(t, "qemu-io")
	pki := testpki.New(t)
	opts, mem := tlsExports()
	opts.TLSConfig = serverConfig(t, pki, true)
	_, _, path := serveUnix(t, opts)
	out := run(t, "qemu-io",
		"--object", "tls-creds-x509,id=tls0,dir="+pki.Dir+",endpoint=client",
		"--image-opts", "driver=nbd,server.type=unix,server.path="+path+",export=disk,tls-creds=tls0,tls-hostname=localhost",
		"-c", "write -P 0x5a 4096 65536", "-c", "read -P 0x5a 4096 65536", "-c", "flush")
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io reported a failure:\n%s", out)
	}
	model := make([]byte, testSize)
	for i := 4096; i < 4096+65536; i++ {
		model[i] = 0x5a
	}
	checkDevice(t, mem, model)
}
