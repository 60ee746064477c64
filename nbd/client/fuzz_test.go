package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/client"
)

// FuzzServerStream plays a server whose every byte is the fuzzer's: the handshake's replies,
// then the replies to a READ, a WRITE and a FLUSH sent together. Whatever it sends, the client
// returns (no hang: the stream ends, then the connection), never panics, and what it accepts
// is sane: block sizes with 1 <= minimum <= maximum, a READ that succeeds returns its bytes
// from the stream right after a reply header naming that request, and after a request fails
// with ErrDisconnected the connection says it is broken.
func FuzzServerStream(f *testing.F) {
	f.Add(seedStream(false), uint8(0))
	f.Add(seedStream(true), uint8(3))
	f.Add(seedExportName(), uint8(2))
	f.Add([]byte{}, uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, mode uint8) {
		cc, sc := socketPair(t)
		served := make(chan struct{})
		go func() { // the server: write the stream and shut down its side, draining the client's bytes
			defer close(served)
			drained := make(chan struct{})
			go func() { io.Copy(io.Discard, sc); close(drained) }()
			sc.Write(stream)
			sc.CloseWrite()
			<-drained
			sc.Close()
		}()
		defer func() { cc.Close(); <-served }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := client.NewConn(ctx, cc, "", client.Options{MaxInFlight: 1 + int(mode%4)})
		if err != nil {
			return
		}
		defer c.Close()
		size, _ := c.Size()
		minB, prefB, maxB := c.BlockSize()
		if size < 0 || minB < 1 || maxB < minB {
			t.Fatalf("accepted size %d, block sizes %d/%d/%d", size, minB, prefB, maxB)
		}
		n := min(size, 4096, int64(maxB))
		p := make([]byte, n)
		results := make(chan error, 3)
		var readErr error
		go func() { _, readErr = c.ReadAt(p, 0); results <- readErr }()
		go func() { _, err := c.WriteAt(make([]byte, n), 0); results <- err }()
		go func() { results <- c.Flush() }()
		for range 3 {
			select {
			case err := <-results:
				if errors.Is(err, client.ErrDisconnected) && c.Err() == nil {
					t.Fatalf("a request failed with %v, the connection says it works", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("a request still waiting 20 s after the stream ended")
			}
		}
		if readErr == nil && !bytes.Contains(stream, p) {
			t.Fatal("READ returned bytes the server never sent")
		}
	})
}

// socketPair returns the two ends of a connected unix stream socket pair: a real socket, so
// the client reads replies through its raw descriptor path (readv), and one whose writing half
// can be shut down while the client still writes.
func socketPair(t *testing.T) (client net.Conn, server *net.UnixConn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// seedStream is a well-formed server stream: greeting, NBD_OPT_GO answered (export of 1 MiB,
// flush, FUA, block sizes), then simple replies for the first three cookies the client uses
// (slot indexes 0-2, first use), the READ's with 4 KiB of payload.
func seedStream(noZeroesGreeting bool) []byte {
	hf := uint16(1)
	if noZeroesGreeting {
		hf = 3
	}
	bs := binary.BigEndian.AppendUint16(nil, 3) // NBD_INFO_BLOCK_SIZE
	bs = binary.BigEndian.AppendUint32(bs, 512)
	bs = binary.BigEndian.AppendUint32(bs, 4096)
	bs = binary.BigEndian.AppendUint32(bs, 1<<25)
	g := append(greeting(hf), goReply(infoExport(1<<20, client.FlagHasFlags|client.FlagSendFlush|client.FlagSendFUA), bs)...)
	for idx := range uint64(3) {
		g = binary.BigEndian.AppendUint32(g, 0x67446698)
		g = binary.BigEndian.AppendUint32(g, 0)
		g = binary.BigEndian.AppendUint64(g, 1<<32|idx)
		if idx == 0 {
			g = append(g, bytes.Repeat([]byte{0x5a}, 4096)...)
		}
	}
	return g
}

// seedExportName is a server stream for NBD_OPT_EXPORT_NAME: a greeting that is not fixed
// newstyle, the export's size and flags with the 124 zero bytes, then a READ's reply.
func seedExportName() []byte {
	g := binary.BigEndian.AppendUint64(greeting(0), 1<<16)
	g = binary.BigEndian.AppendUint16(g, client.FlagHasFlags)
	g = append(g, make([]byte, 124)...)
	g = binary.BigEndian.AppendUint32(g, 0x67446698)
	g = binary.BigEndian.AppendUint32(g, 0)
	g = binary.BigEndian.AppendUint64(g, 1<<32)
	return append(g, bytes.Repeat([]byte{0xa5}, 4096)...)
}

// FuzzParseURI: ParseURI never panics, refuses with ErrBadURI, and what it accepts writes back
// (String) to a URI that parses to the same thing.
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{
		"nbd://localhost", "nbd://127.0.0.1:1234/array", "nbd://[::1]/a%20b",
		"nbd+unix:///exp?socket=/tmp/s.sock", "nbds://host/exp", "nbds+unix:///?socket=/s&x=1",
		"http://host/", "nbd:///exp", "nbd://host/?tls=1", "nbd://h/%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := client.ParseURI(s)
		if err != nil {
			if !errors.Is(err, client.ErrBadURI) {
				t.Fatalf("ParseURI(%q): %v, not ErrBadURI", s, err)
			}
			return
		}
		back, err := client.ParseURI(u.String())
		if err != nil || back != u {
			t.Fatalf("ParseURI(%q) = %+v; its String %q parses to %+v, %v", s, u, u.String(), back, err)
		}
	})
}
