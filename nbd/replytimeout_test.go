package nbd

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// TestReplyTimeout: a client sends 1 MiB READs and never reads a reply. Its replies fill the
// socket, the writer blocks, and its buffers hold the whole server-wide budget, so a second,
// well-behaved client cannot get a request in. ReplyTimeout closes the stuck connection (with
// a log line naming the limit), its buffers return, and the good client is served, its data
// compared byte for byte. Without the timeout the good client would wait for ever.
func TestReplyTimeout(t *testing.T) {
	for _, structured := range []bool{false, true} {
		name := "simple"
		if structured {
			name = "structured"
		}
		t.Run(name, func(t *testing.T) { replyTimeout(t, structured) })
	}
}

func replyTimeout(t *testing.T, structured bool) {
	const timeout = 300 * time.Millisecond
	const reads, bs = 32, 1 << 20
	s, logs, path := serveUnix(t, Options{
		Exports:               []Export{{Device: nbdtest.NewMemDevice(reads * bs)}},
		ReplyTimeout:          timeout,
		MaxTotalInFlightBytes: 16 * bs,
	})
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.(*net.UnixConn).SetReadBuffer(4096)
	bad := newRawClient(t, nc)
	if structured {
		bad.structuredGo("", false)
	} else {
		bad.handshakeGo("")
	}
	for i := range reads {
		bad.request(wire.CmdRead, 0, uint64(i), uint64(i*bs), bs, nil)
	}

	good := dial(t, path)
	good.handshakeGo("")
	for i := range 16 {
		good.roundTrip(uint64(i), uint64(i)*65536, 65536)
	}
	// The stuck connection logs why it closed once it is done, which may be after its buffers
	// came back and the good client was served.
	for deadline := time.Now().Add(10 * time.Second); !logs.loggedErr(ErrReplyTimeout) || !logs.loggedLimit("ReplyTimeout"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Error("no log line with ErrReplyTimeout and limit=ReplyTimeout")
			break
		}
	}
	// The stuck client finds its connection closed after the replies that made it out (reset
	// if the server had not read all its requests).
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, bad.r)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("stuck client: %v after %d bytes, want EOF", err, n)
	}
	if n >= reads*bs {
		t.Errorf("stuck client got %d bytes: every reply was written", n)
	}
	for deadline := time.Now().Add(10 * time.Second); s.conns.Load() != 1 || s.mem.used.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections, %d bytes charged; want the good one and 0", s.conns.Load(), s.mem.used.Load())
		}
	}
}

// TestReplyTimeoutOption: negative is refused, zero is the default.
func TestReplyTimeoutOption(t *testing.T) {
	dev := nbdtest.NewMemDevice(4096)
	if _, err := NewServer(Options{Exports: []Export{{Device: dev}}, ReplyTimeout: -1}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("negative ReplyTimeout: %v, want ErrInvalidOptions", err)
	}
	s, err := NewServer(Options{Exports: []Export{{Device: dev}}})
	if err != nil || s.replyTimeout != DefaultReplyTimeout {
		t.Errorf("default ReplyTimeout: %v, %v", s.replyTimeout, err)
	}
}
