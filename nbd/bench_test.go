package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// benchConn serves an in-memory device on a unix socket and returns a client connection past
// the handshake.
func benchConn(b *testing.B, size int) (net.Conn, *bufio.Reader) {
	b.Helper()
	s, err := NewServer(Options{
		Exports: []Export{{Device: nbdtest.NewMemDevice(size)}},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	ln, path := unixListener(b)
	ctx, cancel := context.WithCancel(context.Background())
	done := serve(ctx, s, ln)
	b.Cleanup(func() {
		cancel()
		<-done
	})
	nc, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	c := &rawClient{t: b, nc: nc, r: bufio.NewReaderSize(nc, 1<<20)}
	c.handshakeGo("")
	return nc, c.r
}

// benchIO runs b.N requests of typ and bs bytes with depth requests in flight, spread over a
// 64 MiB device. The client allocates nothing per request either, so allocs/op is the server's.
func benchIO(b *testing.B, typ uint16, bs, depth int) {
	const size = 64 << 20
	nc, r := benchConn(b, size)
	req := make([]byte, requestHeaderSize+bs)
	binary.BigEndian.PutUint32(req[0:], magicRequest)
	binary.BigEndian.PutUint16(req[6:], typ)
	binary.BigEndian.PutUint32(req[24:], uint32(bs))
	if typ == cmdRead {
		req = req[:requestHeaderSize]
	}
	slots := make(chan struct{}, depth)
	errs := make(chan error, 1)
	go func() {
		hdr := make([]byte, replyHeaderSize)
		payload := make([]byte, bs)
		for i := 0; i < b.N; i++ {
			if _, err := io.ReadFull(r, hdr); err != nil {
				errs <- err
				return
			}
			if binary.BigEndian.Uint32(hdr[4:]) != 0 {
				errs <- io.ErrUnexpectedEOF
				return
			}
			if typ == cmdRead {
				if _, err := io.ReadFull(r, payload); err != nil {
					errs <- err
					return
				}
			}
			<-slots
		}
		errs <- nil
	}()
	b.SetBytes(int64(bs))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		slots <- struct{}{}
		binary.BigEndian.PutUint64(req[8:], uint64(i))
		binary.BigEndian.PutUint64(req[16:], uint64(i*bs)%size)
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

func BenchmarkRead4K(b *testing.B) {
	b.Run("QD1", func(b *testing.B) { benchIO(b, cmdRead, 4096, 1) })
	b.Run("QD32", func(b *testing.B) { benchIO(b, cmdRead, 4096, 32) })
}

func BenchmarkWrite4K(b *testing.B) {
	b.Run("QD1", func(b *testing.B) { benchIO(b, cmdWrite, 4096, 1) })
	b.Run("QD32", func(b *testing.B) { benchIO(b, cmdWrite, 4096, 32) })
}

func BenchmarkRead1M(b *testing.B) {
	b.Run("QD8", func(b *testing.B) { benchIO(b, cmdRead, 1<<20, 8) })
}

func BenchmarkWrite1M(b *testing.B) {
	b.Run("QD8", func(b *testing.B) { benchIO(b, cmdWrite, 1<<20, 8) })
}
