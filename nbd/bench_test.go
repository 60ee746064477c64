package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// benchMode says how a benchmark's server and device handle writes.
type benchMode int

const (
	copyMode      benchMode = iota // StablePages off: WriteAt into a MemDevice
	stableMode                     // StablePages on: WritePinned into an asyncPinned device
	immutableMode                  // StablePages and DebugImmutable on
)

func (m benchMode) String() string {
	return [...]string{"WriteAt", "StablePages", "StablePages+DebugImmutable"}[m]
}

// asyncPinned is an in-memory PinnedWriter shaped like a write-back device: WritePinned copies p
// into memory (the work WriteAt does, so both modes do the same work) and queues release for a
// completion goroutine, which calls it later, as a member write's completion would.
type asyncPinned struct {
	*nbdtest.MemDevice
	completions chan func()
}

func newAsyncPinned(b *testing.B, size int) *asyncPinned {
	d := &asyncPinned{MemDevice: nbdtest.NewMemDevice(size), completions: make(chan func(), 1024)}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for release := range d.completions {
			release()
		}
	}()
	b.Cleanup(func() { // registered before the server's cleanup, so it runs after it
		close(d.completions)
		<-stopped
	})
	return d
}

func (d *asyncPinned) WritePinned(p []byte, off int64, release func()) (int, error) {
	n, err := d.WriteAt(p, off)
	d.completions <- release
	return n, err
}

// benchConn serves an in-memory device on a unix socket and returns a client connection past
// the handshake.
func benchConn(b *testing.B, size int, mode benchMode) (net.Conn, *bufio.Reader) {
	b.Helper()
	var dev Device = nbdtest.NewMemDevice(size)
	if mode != copyMode {
		dev = newAsyncPinned(b, size)
	}
	s, err := NewServer(Options{
		Exports:        []Export{{Device: dev, StablePages: mode != copyMode}},
		Logger:         slog.New(slog.DiscardHandler),
		DebugImmutable: mode == immutableMode,
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
func benchIO(b *testing.B, typ uint16, bs, depth int, mode benchMode) {
	const size = 64 << 20
	nc, r := benchConn(b, size, mode)
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
	b.Run("QD1", func(b *testing.B) { benchIO(b, cmdRead, 4096, 1, copyMode) })
	b.Run("QD32", func(b *testing.B) { benchIO(b, cmdRead, 4096, 32, copyMode) })
}

// benchWrites runs the write benchmark for bs at each depth in every mode; the sub-benchmark
// names end in the mode (WriteAt, StablePages, StablePages+DebugImmutable).
func benchWrites(b *testing.B, bs int, depths ...int) {
	for _, qd := range depths {
		for _, mode := range []benchMode{copyMode, stableMode, immutableMode} {
			b.Run(fmt.Sprintf("QD%d/%v", qd, mode), func(b *testing.B) { benchIO(b, cmdWrite, bs, qd, mode) })
		}
	}
}

func BenchmarkWrite4K(b *testing.B) { benchWrites(b, 4096, 1, 32) }

func BenchmarkRead1M(b *testing.B) {
	b.Run("QD8", func(b *testing.B) { benchIO(b, cmdRead, 1<<20, 8, copyMode) })
}

func BenchmarkWrite1M(b *testing.B) { benchWrites(b, 1<<20, 8) }
