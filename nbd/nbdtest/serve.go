package nbdtest

import (
	"context"
	"net"
	"path/filepath"
	"testing"
)

// Server is what Serve runs: an *nbd.Server (named by its method, since nbd's own tests import
// this package).
type Server interface {
	Serve(ctx context.Context, ln net.Listener) error
}

// Serve runs s.Serve on ln until the test ends. Cleanup cancels it, waits for it to return and
// fails the test if it returned an error.
func Serve(t testing.TB, s Server, ln net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// ServeUnix serves s on a fresh unix socket in a t.TempDir until the test ends, as Serve does,
// and returns the socket's path.
func ServeUnix(t testing.TB, s Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nbd.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	Serve(t, s, ln)
	return path
}

// ServeTCP serves s on a fresh loopback TCP port until the test ends, as Serve does, and
// returns its address (host:port).
func ServeTCP(t testing.TB, s Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	Serve(t, s, ln)
	return ln.Addr().String()
}
