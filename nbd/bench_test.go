package nbd

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/raid5d/raid5d/nbd/internal/wire"
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

// benchConn serves an in-memory device on network ("unix" or "tcp", loopback) and returns a
// client connection past the handshake, with structured replies negotiated if structured.
func benchConn(b *testing.B, network string, size int, mode benchMode, structured bool) (net.Conn, *bufio.Reader) {
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
	addr := nbdtest.ServeTCP
	if network == "unix" {
		addr = nbdtest.ServeUnix
	}
	nc, err := net.Dial(network, addr(b, s))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	c := &rawClient{t: b, nc: nc, r: bufio.NewReaderSize(nc, 1<<20)}
	if structured {
		c.structuredGo("", false)
	} else {
		c.handshakeGo("")
	}
	return nc, c.r
}

// benchIO runs b.N requests of typ and bs bytes with depth requests in flight, spread over a
// 64 MiB device, with simple or structured replies. The client allocates nothing per request
// either, so allocs/op is the server's.
func benchIO(b *testing.B, network string, typ uint16, bs, depth int, mode benchMode, structured bool) {
	const size = 64 << 20
	nc, r := benchConn(b, network, size, mode, structured)
	hs := wire.ReplyHeaderSize
	if structured {
		hs = wire.ChunkHeaderSize
		if typ == wire.CmdRead {
			hs += 8 // the OFFSET_DATA chunk's offset
		}
	}
	req := make([]byte, wire.RequestHeaderSize+bs)
	binary.BigEndian.PutUint32(req[0:], wire.MagicRequest)
	binary.BigEndian.PutUint16(req[6:], typ)
	binary.BigEndian.PutUint32(req[24:], uint32(bs))
	if typ == wire.CmdRead {
		req = req[:wire.RequestHeaderSize]
	}
	slots := make(chan struct{}, depth)
	errs := make(chan error, 1)
	go func() {
		hdr := make([]byte, hs)
		payload := make([]byte, bs)
		for i := 0; i < b.N; i++ {
			if _, err := io.ReadFull(r, hdr); err != nil {
				errs <- err
				return
			}
			ok := binary.BigEndian.Uint32(hdr[4:]) == 0 // simple: error 0
			if structured {
				want := wire.ReplyTypeNone
				if typ == wire.CmdRead {
					want = wire.ReplyTypeOffsetData
				}
				ok = binary.BigEndian.Uint16(hdr[6:]) == want
			}
			if !ok {
				errs <- io.ErrUnexpectedEOF
				return
			}
			if typ == wire.CmdRead {
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

// benchNetworks are the transports every benchmark runs over.
var benchNetworks = []string{"unix", "tcp"}

// benchReads runs the read benchmark for bs at each depth over each transport, named
// <network>/QD<depth>, and with structured replies over a unix socket,
// unix/QD<depth>/structured.
func benchReads(b *testing.B, bs int, depths ...int) {
	for _, network := range benchNetworks {
		for _, qd := range depths {
			b.Run(fmt.Sprintf("%s/QD%d", network, qd), func(b *testing.B) {
				benchIO(b, network, wire.CmdRead, bs, qd, copyMode, false)
			})
		}
	}
	for _, qd := range depths {
		b.Run(fmt.Sprintf("unix/QD%d/structured", qd), func(b *testing.B) {
			benchIO(b, "unix", wire.CmdRead, bs, qd, copyMode, true)
		})
	}
}

// benchWrites runs the write benchmark for bs at each depth over each transport through
// WriteAt, named <network>/QD<depth>/WriteAt, and at the last depth over a unix socket in the
// stable-pages modes (StablePages, StablePages+DebugImmutable).
func benchWrites(b *testing.B, bs int, depths ...int) {
	run := func(network string, qd int, mode benchMode) {
		b.Run(fmt.Sprintf("%s/QD%d/%v", network, qd, mode), func(b *testing.B) {
			benchIO(b, network, wire.CmdWrite, bs, qd, mode, false)
		})
	}
	for _, network := range benchNetworks {
		for _, qd := range depths {
			run(network, qd, copyMode)
		}
	}
	for _, mode := range []benchMode{stableMode, immutableMode} {
		run("unix", depths[len(depths)-1], mode)
	}
	qd := depths[len(depths)-1]
	b.Run(fmt.Sprintf("unix/QD%d/%v/structured", qd, copyMode), func(b *testing.B) {
		benchIO(b, "unix", wire.CmdWrite, bs, qd, copyMode, true)
	})
}

func BenchmarkRead4K(b *testing.B)  { benchReads(b, 4096, 1, 8, 32) }
func BenchmarkWrite4K(b *testing.B) { benchWrites(b, 4096, 1, 8, 32) }
func BenchmarkRead1M(b *testing.B)  { benchReads(b, 1<<20, 1, 8) }
func BenchmarkWrite1M(b *testing.B) { benchWrites(b, 1<<20, 1, 8) }
