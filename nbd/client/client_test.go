package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// The client speaks the Device interface the server serves, so it can be re-exported.
var _ nbd.Device = (*client.Conn)(nil)

// serve runs an nbd.Server with exports on a unix socket for the test's lifetime and returns
// the socket's path.
func serve(t *testing.T, exports ...nbd.Export) string {
	t.Helper()
	srv, err := nbd.NewServer(nbd.Options{Exports: exports, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return nbdtest.ServeUnix(t, srv)
}

func dial(t *testing.T, uri string) *client.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, uri, client.Options{})
	if err != nil {
		t.Fatalf("Dial %s: %v", uri, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestHandshakeGo(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	sock := serve(t,
		nbd.Export{Name: "a", Device: nbdtest.NewMemDevice(4096)},
		nbd.Export{Name: "b", Device: nbdtest.FUADevice{MemDevice: dev}, PreferredBlock: 64 << 10, MaxBlock: 1 << 20},
		nbd.Export{Name: "ro", Device: dev, ReadOnly: true},
	)
	c := dial(t, "nbd+unix:///b?socket="+sock)
	if size, _ := c.Size(); size != 1<<20 {
		t.Errorf("Size = %d, want %d", size, 1<<20)
	}
	if mn, pref, mx := c.BlockSize(); mn != nbd.DefaultMinBlock || pref != 64<<10 || mx != 1<<20 {
		t.Errorf("BlockSize = %d %d %d, want %d %d %d", mn, pref, mx, nbd.DefaultMinBlock, 64<<10, 1<<20)
	}
	want := client.FlagHasFlags | client.FlagSendFlush | client.FlagSendFUA | client.FlagSendTrim | client.FlagSendWriteZeroes
	if c.Flags()&want != want || c.Flags()&client.FlagReadOnly != 0 {
		t.Errorf("Flags = %#x, want %#x set and read-only clear", c.Flags(), want)
	}
	if n := c.ExportName(); n != "b" {
		t.Errorf("ExportName = %q, want the server's NBD_INFO_NAME \"b\"", n)
	}
	// The empty name is the server's default export, which the server names.
	def := dial(t, "nbd+unix:///?socket="+sock)
	if size, _ := def.Size(); size != 4096 {
		t.Errorf("default export size = %d, want 4096", size)
	}
	if n := def.ExportName(); n != "a" {
		t.Errorf("default export: ExportName = %q, want the server's name for it, \"a\"", n)
	}

	ro := dial(t, "nbd+unix:///ro?socket="+sock)
	if ro.Flags()&client.FlagReadOnly == 0 {
		t.Errorf("read-only export: Flags %#x lack FlagReadOnly", ro.Flags())
	}
	if _, err := ro.WriteAt(make([]byte, 512), 0); !errors.Is(err, client.ErrReadOnly) {
		t.Errorf("WriteAt on read-only export: %v, want ErrReadOnly", err)
	}

	_, err := client.Dial(context.Background(), "nbd+unix:///nope?socket="+sock, client.Options{})
	var oe *client.OptionError
	if !errors.As(err, &oe) || oe.Reply != 1<<31|6 {
		t.Errorf("Dial unknown export: %v, want OptionError NBD_REP_ERR_UNKNOWN", err)
	}
}

// TestReadWritePipelined drives one connection from many goroutines with random reads and
// writes on disjoint blocks, checks every byte against a model, and checks that the device saw
// requests concurrently (they were pipelined, not serialised).
// TestMixedSizesPipelined: READs of sizes on both sides of the reply reader's direct reads
// (16 KiB: a large payload goes from the socket straight into the caller's buffer, and the
// header after it unbuffered) interleave on one connection; every byte read is what was
// written.
func TestMixedSizesPipelined(t *testing.T) {
	const workers, slot, rounds = 16, 256 << 10, 60
	sizes := []int{512, 4096, 16<<10 - 512, 16 << 10, 20 << 10, 64 << 10, 200 << 10}
	dev := nbdtest.NewMemDevice(workers * slot)
	sock := serve(t, nbd.Export{Name: "m", Device: dev})
	c := dial(t, "nbd+unix:///m?socket="+sock)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			model := make([]byte, slot) // worker w owns [w*slot, (w+1)*slot)
			got := make([]byte, slot)
			for range rounds {
				n := sizes[rng.IntN(len(sizes))]
				off := rng.IntN((slot-n)/512+1) * 512
				if rng.IntN(3) == 0 {
					buf := model[off : off+n]
					for i := range buf {
						buf[i] = byte(rng.Uint32())
					}
					if _, err := c.WriteAt(buf, int64(w*slot+off)); err != nil {
						errs <- err
						return
					}
					continue
				}
				if _, err := c.ReadAt(got[off:off+n], int64(w*slot+off)); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got[off:off+n], model[off:off+n]) {
					errs <- fmt.Errorf("worker %d: a read of %d bytes at %d differs from what was written", w, n, off)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestVectored: ReadvAt and WritevAt are one request each (the server sees one READ, one
// WRITE), their buffers of mixed sizes (through the reply buffer and straight from the
// socket) filled and written one after another; pipelined with single-buffer requests, every
// byte checked; a total past the server's maximum block size is refused unsent.
func TestVectored(t *testing.T) {
	const max = 256 << 10
	dev := nbdtest.NewMemDevice(4 << 20)
	sock := serve(t, nbd.Export{Name: "m", Device: dev, MinBlock: 1, PreferredBlock: 4096, MaxBlock: max})
	c := dial(t, "nbd+unix:///m?socket="+sock)
	sizes := []int{4096, 64 << 10, 512, 16 << 10, 100 << 10, 20 << 10}
	data := make([]byte, 0, max)
	rng := rand.New(rand.NewPCG(7, 7))
	var bufs, rbufs [][]byte
	got := make([]byte, 0, max)
	for _, n := range sizes {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		data = append(data, b...)
		bufs = append(bufs, data[len(data)-n:])
		got = got[:len(got)+n]
		rbufs = append(rbufs, got[len(got)-n:])
	}
	const off = 1<<20 + 512
	before := dev.Stats()
	if n, err := c.WritevAt(bufs, off); n != len(data) || err != nil {
		t.Fatalf("WritevAt = %d, %v", n, err)
	}
	if w := dev.Stats().Writes - before.Writes; w != 1 {
		t.Errorf("WritevAt: %d WRITEs, want 1", w)
	}
	if !bytes.Equal(dev.Bytes()[off:off+len(data)], data) {
		t.Fatal("the device does not hold what WritevAt wrote")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 { // vectored reads among plain ones, pipelined on the one connection
		wg.Go(func() {
			if i%2 == 0 {
				p := make([]byte, 64<<10)
				if _, err := c.ReadAt(p, off); err != nil || !bytes.Equal(p, data[:len(p)]) {
					errs <- fmt.Errorf("ReadAt: %v, or other bytes", err)
				}
				return
			}
			mine := make([]byte, len(data))
			var bs [][]byte
			at := 0
			for _, n := range sizes {
				bs = append(bs, mine[at:at+n])
				at += n
			}
			if n, err := c.ReadvAt(bs, off); n != len(data) || err != nil || !bytes.Equal(mine, data) {
				errs <- fmt.Errorf("ReadvAt = %d, %v; same bytes %v", n, err, bytes.Equal(mine, data))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	before = dev.Stats()
	if n, err := c.ReadvAt(rbufs, off); n != len(got) || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadvAt = %d, %v; same bytes %v", n, err, bytes.Equal(got, data))
	}
	if r := dev.Stats().Reads - before.Reads; r != 1 {
		t.Errorf("ReadvAt: %d READs, want 1", r)
	}
	big := append(bufs, make([]byte, max))
	if _, err := c.WritevAt(big, off); !errors.Is(err, client.ErrTooLarge) {
		t.Errorf("WritevAt past the maximum block size: %v, want ErrTooLarge", err)
	}
	if _, err := c.ReadvAt(big, off); !errors.Is(err, client.ErrTooLarge) {
		t.Errorf("ReadvAt past the maximum block size: %v, want ErrTooLarge", err)
	}
}

func TestReadWritePipelined(t *testing.T) {
	const size, bs, workers, rounds = 1 << 20, 4096, 32, 40
	dev := nbdtest.NewMemDevice(size)
	var once sync.Once
	dev.Delay = func(op nbdtest.Op, off, n int64) {
		// Hold the first request until others have arrived, so overlap is observed.
		once.Do(func() { time.Sleep(20 * time.Millisecond) })
	}
	sock := serve(t, nbd.Export{Name: "m", Device: dev})
	c := dial(t, "nbd+unix:///m?socket="+sock)

	model := make([]byte, size)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, bs)
			got := make([]byte, bs)
			for range rounds {
				// worker w owns blocks w, w+workers, ...
				blk := w + workers*rng.IntN(size/bs/workers)
				off := int64(blk * bs)
				for i := range buf {
					buf[i] = byte(rng.Uint32())
				}
				if _, err := c.WriteAt(buf, off); err != nil {
					errs <- err
					return
				}
				copy(model[off:], buf)
				if _, err := c.ReadAt(got, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, buf) {
					errs <- errors.New("read back differs from what was written")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	whole := make([]byte, size)
	if _, err := c.ReadAt(whole, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(whole, model) || !bytes.Equal(dev.Bytes(), model) {
		t.Fatal("device contents differ from the model")
	}
	if st := dev.Stats(); st.MaxConcurrent < 2 {
		t.Errorf("device saw at most %d concurrent requests; the client did not pipeline", st.MaxConcurrent)
	}
}

func TestCommands(t *testing.T) {
	dev := nbdtest.NewMemDevice(64 << 10)
	sock := serve(t, nbd.Export{Name: "f", Device: nbdtest.FUADevice{MemDevice: dev}})
	c := dial(t, "nbd+unix:///f?socket="+sock)
	ones := bytes.Repeat([]byte{0xff}, 64<<10)
	if _, err := c.WriteAtFUA(ones, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Trim(4096, 4096); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteZeroes(16384, 8192, true); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(ones)
	clear(want[4096:8192])
	clear(want[16384:24576])
	if !bytes.Equal(dev.Bytes(), want) {
		t.Error("device contents after FUA write, trim and write-zeroes are wrong")
	}
	st := dev.Stats()
	if st.FUAWrites != 1 || st.Flushes != 1 || st.Trims != 1 || st.WriteZeroes != 1 || st.NoHole != 1 {
		t.Errorf("device stats %+v, want one each of FUA write, flush, trim, write-zeroes (no hole)", st)
	}
	for _, tc := range []struct {
		name string
		err  error
		fn   func() error
	}{
		{"read past end", client.ErrRange, func() error { _, err := c.ReadAt(make([]byte, 512), 64<<10); return err }},
		{"negative offset", client.ErrRange, func() error { _, err := c.WriteAt(make([]byte, 512), -512); return err }},
		{"trim past end", client.ErrRange, func() error { return c.Trim(0, 128<<10) }},
		{"read too large", client.ErrTooLarge, func() error {
			dev2 := nbdtest.NewMemDevice(64 << 20)
			c2 := dial(t, "nbd+unix:///?socket="+serve(t, nbd.Export{Name: "big", Device: dev2}))
			_, err := c2.ReadAt(make([]byte, 33<<20), 0)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.fn(); !errors.Is(err, tc.err) {
				t.Errorf("got %v, want %v", err, tc.err)
			}
		})
	}
}

func TestServerErrors(t *testing.T) {
	dev := nbdtest.NewMemDevice(64 << 10)
	dev.Fail = func(op nbdtest.Op, off, n int64) error {
		if op == nbdtest.OpWrite && off == 8192 {
			return syscall.ENOSPC
		}
		if op == nbdtest.OpFlush {
			return errors.New("disk on fire") // becomes EIO
		}
		return nil
	}
	sock := serve(t, nbd.Export{Name: "e", Device: dev})
	c := dial(t, "nbd+unix:///e?socket="+sock)
	_, err := c.WriteAt(make([]byte, 4096), 8192)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Errno != 28 || ce.Cmd != "WRITE" || ce.Offset != 8192 || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("failed write: %v, want *Error WRITE at 8192 with ENOSPC", err)
	}
	if err := c.Flush(); !errors.Is(err, syscall.EIO) {
		t.Errorf("failed flush: %v, want EIO", err)
	}
	// The connection goes on after a failed request.
	if _, err := c.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Errorf("write after failed requests: %v", err)
	}
}

// fakeServer runs fn as the server end of a pipe and returns the client end.
func fakeServer(t *testing.T, fn func(nc net.Conn)) net.Conn {
	cc, sc := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sc.Close()
		fn(sc)
	}()
	t.Cleanup(func() {
		cc.Close()
		<-done
	})
	cc.SetDeadline(time.Now().Add(10 * time.Second))
	return cc
}

func readN(nc net.Conn, n int) []byte {
	b := make([]byte, n)
	io.ReadFull(nc, b)
	return b
}

// TestExportNameFallback: a server that does not know NBD_OPT_GO and does not offer NO_ZEROES
// gets NBD_OPT_EXPORT_NAME and its 124 zero bytes are consumed; then a READ works.
func TestExportNameFallback(t *testing.T) {
	cc := fakeServer(t, func(nc net.Conn) {
		g := binary.BigEndian.AppendUint64(nil, 0x4e42444d41474943)
		g = binary.BigEndian.AppendUint64(g, 0x49484156454f5054)
		g = binary.BigEndian.AppendUint16(g, 1) // fixed newstyle only
		nc.Write(g)
		if f := binary.BigEndian.Uint32(readN(nc, 4)); f != 1 {
			t.Errorf("client flags %#x, want 1 (no NO_ZEROES when not offered)", f)
		}
		h := readN(nc, 16)
		readN(nc, int(binary.BigEndian.Uint32(h[12:16])))
		if opt := binary.BigEndian.Uint32(h[8:12]); opt != 7 {
			t.Errorf("first option %d, want NBD_OPT_GO", opt)
		}
		r := binary.BigEndian.AppendUint64(nil, 0x3e889045565a9)
		r = binary.BigEndian.AppendUint32(r, 7)
		r = binary.BigEndian.AppendUint32(r, 1<<31|1)
		r = binary.BigEndian.AppendUint32(r, 0)
		nc.Write(r)
		h = readN(nc, 16)
		name := readN(nc, int(binary.BigEndian.Uint32(h[12:16])))
		if opt := binary.BigEndian.Uint32(h[8:12]); opt != 1 || string(name) != "exp" {
			t.Errorf("second option %d %q, want NBD_OPT_EXPORT_NAME \"exp\"", opt, name)
		}
		e := binary.BigEndian.AppendUint64(nil, 8192)
		e = binary.BigEndian.AppendUint16(e, 1)
		nc.Write(append(e, make([]byte, 124)...))
		req := readN(nc, 28)
		rep := binary.BigEndian.AppendUint32(nil, 0x67446698)
		rep = binary.BigEndian.AppendUint32(rep, 0)
		rep = append(rep, req[8:16]...)
		nc.Write(append(rep, bytes.Repeat([]byte{7}, 512)...))
		readN(nc, 28) // DISC
	})
	c, err := client.NewConn(context.Background(), cc, "exp", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if size, _ := c.Size(); size != 8192 {
		t.Errorf("size %d, want 8192", size)
	}
	if n := c.ExportName(); n != "" {
		t.Errorf("ExportName %q after NBD_OPT_EXPORT_NAME, want \"\" (no NBD_INFO_NAME)", n)
	}
	p := make([]byte, 512)
	if _, err := c.ReadAt(p, 0); err != nil || !bytes.Equal(p, bytes.Repeat([]byte{7}, 512)) {
		t.Errorf("ReadAt: %v, data %x...", err, p[:4])
	}
	if err := c.Flush(); !errors.Is(err, client.ErrUnsupported) {
		t.Errorf("Flush without SEND_FLUSH: %v, want ErrUnsupported", err)
	}
}

// TestBrokenConnection: a server that drops the connection fails the requests in flight and
// every later one with ErrDisconnected, the later ones with ErrNotSent too, and Done and Err
// say so; one that replies with a cookie it was never sent breaks the connection too.
func TestBrokenConnection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply func(nc net.Conn, req []byte)
	}{
		{"server closes", func(nc net.Conn, req []byte) {}},
		{"unknown cookie", func(nc net.Conn, req []byte) {
			rep := binary.BigEndian.AppendUint32(nil, 0x67446698)
			rep = binary.BigEndian.AppendUint32(rep, 0)
			nc.Write(binary.BigEndian.AppendUint64(rep, 0xdeadbeef))
		}},
		{"bad magic", func(nc net.Conn, req []byte) { nc.Write(make([]byte, 16)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := fakeServer(t, func(nc net.Conn) {
				goHandshake(nc, 4096, client.FlagHasFlags|client.FlagSendFlush)
				tc.reply(nc, readN(nc, 28))
			})
			c, err := client.NewConn(context.Background(), cc, "", client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Err() != nil {
				t.Errorf("Err before the break: %v", c.Err())
			}
			if err := c.Flush(); !errors.Is(err, client.ErrDisconnected) || errors.Is(err, client.ErrNotSent) {
				t.Errorf("Flush in flight: %v, want ErrDisconnected, not ErrNotSent", err)
			}
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Done not closed after the break")
			}
			if err := c.Err(); !errors.Is(err, client.ErrDisconnected) {
				t.Errorf("Err after the break: %v, want ErrDisconnected", err)
			}
			if _, err := c.ReadAt(make([]byte, 512), 0); !errors.Is(err, client.ErrDisconnected) || !errors.Is(err, client.ErrNotSent) {
				t.Errorf("ReadAt after the break: %v, want ErrDisconnected and ErrNotSent", err)
			}
		})
	}
}

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want client.URI
		err  bool
	}{
		{"nbd://localhost", client.URI{"tcp", "localhost:10809", "", false}, false},
		{"nbd://127.0.0.1:1234/array", client.URI{"tcp", "127.0.0.1:1234", "array", false}, false},
		{"nbd://[::1]/a%20b", client.URI{"tcp", "[::1]:10809", "a b", false}, false},
		{"nbd+unix:///exp?socket=/tmp/s.sock", client.URI{"unix", "/tmp/s.sock", "exp", false}, false},
		{"nbd+unix:///?socket=/tmp/s.sock", client.URI{"unix", "/tmp/s.sock", "", false}, false},
		{"nbds://host/exp", client.URI{"tcp", "host:10809", "exp", true}, false},
		{"nbds+unix:///exp?socket=/tmp/s.sock", client.URI{"unix", "/tmp/s.sock", "exp", true}, false},
		{"nbd+unix:///exp", client.URI{}, true},
		{"nbd+unix://host/exp?socket=/s", client.URI{}, true},
		{"nbds+unix:///exp", client.URI{}, true},
		{"nbds+unix:///?socket=/s&tls-certificates=/d", client.URI{}, true},
		{"http://host/", client.URI{}, true},
		{"nbd:///exp", client.URI{}, true},
		{"nbd://host/?tls=1", client.URI{}, true},
		{"nbd://[fe80::1%25eth0]:99/x", client.URI{"tcp", "[fe80::1%eth0]:99", "x", false}, false},
		{"nbd://::", client.URI{}, true}, // a fuzzer's find: once accepted as host ":"
		{"nbd://::1/", client.URI{}, true},
		{"nbd://:10809/", client.URI{}, true},
		{"nbd://[1.2.3.4]/", client.URI{}, true},
		{"nbd://a%20b/", client.URI{}, true},
		{"nbd://host:0/", client.URI{}, true},
		{"nbd://host:65536/", client.URI{}, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := client.ParseURI(tc.in)
			if tc.err {
				if !errors.Is(err, client.ErrBadURI) {
					t.Errorf("err = %v, want ErrBadURI", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			if back, err := client.ParseURI(got.String()); err != nil || back != got {
				t.Errorf("String %q parses to %+v, %v", got.String(), back, err)
			}
		})
	}
}

// TestNbdkit runs against nbdkit's memory plugin: the client works with a server that is not
// ours. Skipped without nbdkit unless RAID5D_REQUIRE_TOOLS=1.
func TestNbdkit(t *testing.T) {
	if _, err := exec.LookPath("nbdkit"); err != nil {
		if os.Getenv("RAID5D_REQUIRE_TOOLS") == "1" {
			t.Fatalf("nbdkit is required (RAID5D_REQUIRE_TOOLS=1): %v", err)
		}
		t.Skip("nbdkit not installed")
	}
	uri := StartNbdkit(t, "memory", "8M")
	c := dial(t, uri)
	if size, _ := c.Size(); size != 8<<20 {
		t.Fatalf("size %d, want 8M", size)
	}
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if _, err := c.WriteAtFUA(data, int64(i)<<20); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1<<20)
	for i := range 8 {
		if _, err := c.ReadAt(got, int64(i)<<20); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("MiB %d: %v, or data differs", i, err)
		}
	}
	if err := c.WriteZeroes(0, 8<<20, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, make([]byte, 1<<20)) {
		t.Fatalf("after WriteZeroes: %v, or not zero", err)
	}
}

// StartNbdkit runs nbdkit with plugin and args on a unix socket for the test's lifetime and
// returns its URI.
func StartNbdkit(t *testing.T, plugin string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "nbdkit.sock")
	pidfile := filepath.Join(dir, "pid")
	cmd := exec.Command("nbdkit", append([]string{"--foreground", "--unix", sock, "--pidfile", pidfile, plugin}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(pidfile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nbdkit did not start within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "nbd+unix:///?socket=" + sock
}

// TestNoAllocs: a request allocates nothing in steady state (client and in-process server
// together, since AllocsPerRun counts the whole process).
func TestNoAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	dev := nbdtest.FUADevice{MemDevice: nbdtest.NewMemDevice(1 << 20)}
	c := dial(t, "nbd+unix:///?socket="+serve(t, nbd.Export{Name: "a", Device: dev}))
	buf, big := make([]byte, 4096), make([]byte, 64<<10)
	bufs := [][]byte{big[:32<<10], big[32<<10:]}
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"write", func() { c.WriteAt(buf, 8192) }},
		{"read", func() { c.ReadAt(buf, 8192) }},
		{"read-64k", func() { c.ReadAt(big, 65536) }}, // straight into big (directMin)
		{"readv", func() { c.ReadvAt(bufs, 65536) }},
		{"writev", func() { c.WritevAt(bufs, 65536) }},
		{"fua", func() { c.WriteAtFUA(buf, 8192) }},
		{"flush", func() { c.Flush() }},
	} {
		if n := testing.AllocsPerRun(200, tc.fn); n > 0.1 {
			t.Errorf("%s: %.2f allocations per request", tc.name, n)
		}
	}
}
