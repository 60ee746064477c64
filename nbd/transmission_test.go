package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// checkDevice compares every byte of dev with model.
func checkDevice(t *testing.T, dev *nbdtest.MemDevice, model []byte) {
	t.Helper()
	got := dev.Bytes()
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("device differs from model at byte %d: %#x, want %#x", i, got[i], model[i])
	}
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestCommands(t *testing.T) {
	for _, fuaDev := range []bool{false, true} {
		t.Run(fmt.Sprintf("FUAWriter=%v", fuaDev), func(t *testing.T) {
			mem := nbdtest.NewMemDevice(testSize)
			var dev Device = mem
			if fuaDev {
				dev = nbdtest.FUADevice{MemDevice: mem}
			}
			s, _ := testServer(t, Options{Exports: []Export{{Device: dev}}})
			c, done := pipe(t, s)
			c.handshakeGo("")
			model := make([]byte, testSize)
			ok := func(what string, errno uint32) {
				t.Helper()
				if errno != 0 {
					t.Fatalf("%s: errno %d", what, errno)
				}
			}

			p := pattern(1, 64<<10)
			errno, _ := c.do(wire.CmdWrite, 0, 4096, uint32(len(p)), p)
			ok("WRITE", errno)
			copy(model[4096:], p)

			p = pattern(2, 8192)
			errno, _ = c.do(wire.CmdWrite, wire.CmdFlagFUA, 512*3, uint32(len(p)), p)
			ok("WRITE FUA", errno)
			copy(model[512*3:], p)
			st := mem.Stats()
			if fuaDev && (st.FUAWrites != 1 || st.Flushes != 0) {
				t.Errorf("FUA write on a FUAWriter: %+v, want 1 WriteAtFUA and no Flush", st)
			}
			if !fuaDev && (st.Writes != 2 || st.Flushes != 1) {
				t.Errorf("FUA write on a plain device: %+v, want WriteAt then Flush", st)
			}

			errno, got := c.do(wire.CmdRead, 0, 0, 128<<10, nil)
			ok("READ", errno)
			if i := firstDiff(got, model[:128<<10]); i >= 0 {
				t.Fatalf("READ differs at %d", i)
			}

			flushes := mem.Stats().Flushes
			errno, _ = c.do(wire.CmdFlush, 0, 0, 0, nil)
			ok("FLUSH", errno)
			if mem.Stats().Flushes != flushes+1 {
				t.Error("FLUSH did not reach the device")
			}

			errno, _ = c.do(wire.CmdTrim, 0, 8192, 4096, nil)
			ok("TRIM", errno)
			clear(model[8192 : 8192+4096]) // MemDevice zeroes trimmed ranges

			errno, _ = c.do(wire.CmdWriteZeroes, 0, 16384, 1024, nil)
			ok("WRITE_ZEROES", errno)
			clear(model[16384 : 16384+1024])
			flushes = mem.Stats().Flushes
			errno, _ = c.do(wire.CmdWriteZeroes, wire.CmdFlagNoHole|wire.CmdFlagFUA, 32768, 8192, nil)
			ok("WRITE_ZEROES NO_HOLE FUA", errno)
			clear(model[32768 : 32768+8192])
			if st := mem.Stats(); st.WriteZeroes != 2 || st.NoHole != 1 || st.Flushes != flushes+1 {
				t.Errorf("WRITE_ZEROES: %+v, want 2 calls, 1 NO_HOLE, a Flush for FUA", st)
			}
			errno, _ = c.do(wire.CmdTrim, wire.CmdFlagFUA, 65536, 512, nil)
			ok("TRIM FUA", errno)
			clear(model[65536 : 65536+512])

			errno, _ = c.do(wire.CmdCache, 0, 0, 4096, nil)
			ok("CACHE", errno)
			errno, got = c.do(wire.CmdRead, 0, 0, 0, nil)
			ok("READ of 0 bytes", errno)

			// The last bytes of the device, and a read of all of it.
			p = pattern(3, 512)
			errno, _ = c.do(wire.CmdWrite, 0, testSize-512, 512, p)
			ok("WRITE at end", errno)
			copy(model[testSize-512:], p)
			errno, got = c.do(wire.CmdRead, 0, 0, testSize, nil)
			ok("READ all", errno)
			if i := firstDiff(got, model); i >= 0 {
				t.Fatalf("READ all differs at %d", i)
			}
			checkDevice(t, mem, model)

			c.request(wire.CmdDisc, 0, 1, 0, 0, nil)
			c.expectClosed()
			<-done
		})
	}
}

// errnoErr carries its own NBD error value.
type errnoErr uint32

func (e errnoErr) Error() string { return fmt.Sprintf("errno %d", uint32(e)) }
func (e errnoErr) Errno() uint32 { return uint32(e) }

func TestRequestErrors(t *testing.T) {
	opts, d0, d1 := twoExports()
	injected := errors.New("injected")
	var failMu sync.Mutex
	var fail error // guarded by failMu
	d0.Fail = func(op nbdtest.Op, off, n int64) error {
		failMu.Lock()
		defer failMu.Unlock()
		if off == 1234*512 {
			return fail
		}
		return nil
	}
	s, logs := testServer(t, opts)
	c, _ := pipe(t, s)
	c.handshakeGo("disk")
	ro, _ := pipe(t, s)
	ro.handshakeGo("ro")
	before0, before1 := d0.Bytes(), d1.Bytes()

	tests := []struct {
		name    string
		c       *rawClient
		typ     uint16
		flags   uint16
		off     uint64
		length  uint32
		payload bool
		want    uint32
	}{
		{"read past end", c, wire.CmdRead, 0, testSize - 512, 1024, false, wire.EINVAL},
		{"read offset past end", c, wire.CmdRead, 0, 1 << 40, 512, false, wire.EINVAL},
		{"read offset+length overflows", c, wire.CmdRead, 0, ^uint64(0) - 511, 1024, false, wire.EINVAL},
		{"write past end", c, wire.CmdWrite, 0, testSize - 512, 1024, true, wire.ENOSPC},
		{"write zeroes past end", c, wire.CmdWriteZeroes, 0, testSize, 512, false, wire.ENOSPC},
		{"trim past end", c, wire.CmdTrim, 0, testSize - 512, 4096, false, wire.EINVAL},
		{"cache past end", c, wire.CmdCache, 0, testSize, 512, false, wire.EINVAL},
		{"misaligned read offset", c, wire.CmdRead, 0, 100, 512, false, wire.EINVAL},
		{"misaligned write length", c, wire.CmdWrite, 0, 512, 100, true, wire.EINVAL},
		{"read longer than MaxBlock", c, wire.CmdRead, 0, 0, 32<<20 + 512, false, wire.EINVAL},
		{"unknown command", c, 99, 0, 0, 0, false, wire.EINVAL},
		{"BLOCK_STATUS without contexts", c, wire.CmdBlockStatus, 0, 0, 512, false, wire.EINVAL},
		{"unknown flag", c, wire.CmdRead, 1 << 9, 0, 512, false, wire.EINVAL},
		{"NO_HOLE on write", c, wire.CmdWrite, wire.CmdFlagNoHole, 0, 512, true, wire.EINVAL},
		{"DF not negotiated", c, wire.CmdRead, wire.CmdFlagDF, 0, 512, false, wire.EINVAL},
		{"FAST_ZERO not advertised", c, wire.CmdWriteZeroes, wire.CmdFlagFastZero, 0, 512, false, wire.EINVAL},
		{"write to read-only", ro, wire.CmdWrite, 0, 0, 4096, true, wire.EPERM},
		{"trim read-only", ro, wire.CmdTrim, 0, 0, 4096, false, wire.EPERM},
		{"write zeroes read-only", ro, wire.CmdWriteZeroes, 0, 0, 4096, false, wire.EPERM},
		{"FUA not advertised on read-only", ro, wire.CmdRead, wire.CmdFlagFUA, 0, 4096, false, wire.EINVAL},
		{"read-only min block 4096", ro, wire.CmdRead, 0, 512, 4096, false, wire.EINVAL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var payload []byte
			if tt.payload {
				payload = pattern(9, int(tt.length))
			}
			if errno, _ := tt.c.do(tt.typ, tt.flags, tt.off, tt.length, payload); errno != tt.want {
				t.Fatalf("errno %d, want %d", errno, tt.want)
			}
			// The connection is still usable and in step.
			if errno, _ := tt.c.do(wire.CmdRead, 0, 0, 4096, nil); errno != 0 {
				t.Fatalf("READ after the error: errno %d", errno)
			}
		})
	}
	if i := firstDiff(d0.Bytes(), before0); i >= 0 {
		t.Errorf("refused requests changed the device at %d", i)
	}
	if i := firstDiff(d1.Bytes(), before1); i >= 0 {
		t.Errorf("refused requests changed the read-only device at %d", i)
	}

	for _, tt := range []struct {
		name string
		err  error
		want uint32
	}{
		{"plain error", injected, wire.EIO},
		{"own errno", fmt.Errorf("wrapped: %w", errnoErr(wire.ENOSPC)), wire.ENOSPC},
		{"own errno undefined", errnoErr(77), wire.EIO},
		{"syscall ENOSPC", &wrapErr{syscall.ENOSPC}, wire.ENOSPC},
		{"syscall EDQUOT", syscall.EDQUOT, wire.ENOSPC},
		{"syscall EROFS", syscall.EROFS, wire.EPERM},
		{"syscall EIO", syscall.EIO, wire.EIO},
		{"syscall ENOMEM", syscall.ENOMEM, wire.EIO},
	} {
		t.Run("device "+tt.name, func(t *testing.T) {
			failMu.Lock()
			fail = tt.err
			failMu.Unlock()
			for _, typ := range []uint16{wire.CmdRead, wire.CmdWrite, wire.CmdTrim, wire.CmdWriteZeroes} {
				var payload []byte
				if typ == wire.CmdWrite {
					payload = make([]byte, 512)
				}
				if errno, _ := c.do(typ, 0, 1234*512, 512, payload); errno != tt.want {
					t.Errorf("%s: errno %d, want %d", wire.CmdName(typ), errno, tt.want)
				}
			}
			if errno, _ := c.do(wire.CmdRead, 0, 0, 4096, nil); errno != 0 {
				t.Fatalf("READ after a device error: errno %d", errno)
			}
		})
	}
	if !logs.loggedErr(injected) {
		t.Error("device error not logged")
	}
}

type wrapErr struct{ err error }

func (w *wrapErr) Error() string { return "wrapped: " + w.err.Error() }
func (w *wrapErr) Unwrap() error { return w.err }

func TestBrokenStreamCloses(t *testing.T) {
	for _, tt := range []struct {
		name string
		send func(c *rawClient)
		want error
	}{
		{"garbage magic", func(c *rawClient) { c.write(bytes.Repeat([]byte{0xde, 0xad}, 14)) }, ErrBadRequestMagic},
		{"write longer than MaxBlock", func(c *rawClient) {
			c.request(wire.CmdWrite, 0, 1, 0, 32<<20+512, nil)
		}, ErrPayloadTooLarge},
		{"write length 4 GiB", func(c *rawClient) {
			c.request(wire.CmdWrite, 0, 1, 0, ^uint32(0), nil)
		}, ErrPayloadTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, logs := testServer(t, Options{Exports: []Export{{Device: nbdtest.NewMemDevice(testSize)}}})
			c, done := pipe(t, s)
			c.handshakeGo("")
			if errno, _ := c.do(wire.CmdRead, 0, 0, 512, nil); errno != 0 {
				t.Fatal(errno)
			}
			tt.send(c)
			c.expectClosed()
			<-done
			if !logs.loggedErr(tt.want) {
				t.Errorf("no log line with %v", tt.want)
			}
		})
	}
}

// TestPipelining keeps many requests in flight on one connection, against a device that
// delays each call randomly so replies come back out of order, and checks every byte.
func TestPipelining(t *testing.T) {
	const (
		blocks = 256
		bs     = 4096
	)
	mem := nbdtest.NewMemDevice(blocks * bs)
	mem.Delay = func(op nbdtest.Op, off, n int64) {
		time.Sleep(time.Duration(off/bs%7) * 100 * time.Microsecond)
	}
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}, MaxInFlightRequests: 32})
	c, _ := pipe(t, s)
	c.handshakeGo("")

	model := make([]byte, blocks*bs)
	// Round 1: write every block; round 2: read every block back. Replies are read by a
	// second goroutine while requests are still being sent.
	for round, typ := range []uint16{wire.CmdWrite, wire.CmdRead} {
		type result struct {
			errno  uint32
			cookie uint64
			data   []byte
		}
		results := make(chan result, blocks)
		var outOfOrder bool
		go func() {
			defer close(results)
			for i := 0; i < blocks; i++ {
				errno, cookie := c.reply()
				r := result{errno: errno, cookie: cookie}
				if typ == wire.CmdRead && errno == 0 {
					r.data = c.read(bs)
				}
				if cookie != uint64(i) {
					outOfOrder = true
				}
				results <- r
			}
		}()
		for i := 0; i < blocks; i++ {
			var payload []byte
			if typ == wire.CmdWrite {
				payload = pattern(uint64(100+i), bs)
				copy(model[i*bs:], payload)
			}
			c.request(typ, 0, uint64(i), uint64(i*bs), bs, payload)
		}
		seen := make(map[uint64]bool)
		for r := range results {
			if r.errno != 0 || r.cookie >= blocks || seen[r.cookie] {
				t.Fatalf("round %d: reply errno %d cookie %d (seen before: %v)", round, r.errno, r.cookie, seen[r.cookie])
			}
			seen[r.cookie] = true
			if typ == wire.CmdRead {
				off := int(r.cookie) * bs
				if i := firstDiff(r.data, model[off:off+bs]); i >= 0 {
					t.Fatalf("block %d differs at byte %d", r.cookie, i)
				}
			}
		}
		if len(seen) != blocks {
			t.Fatalf("round %d: %d replies, want %d", round, len(seen), blocks)
		}
		t.Logf("round %d: replies out of order: %v", round, outOfOrder)
	}
	checkDevice(t, mem, model)
	if st := mem.Stats(); st.MaxConcurrent < 2 || st.MaxConcurrent > 32 {
		t.Errorf("device saw at most %d calls at once; want 2..32 (MaxInFlightRequests)", st.MaxConcurrent)
	}
}

// TestInFlightBytesBound: with MaxInFlightBytes = 4 requests' worth, no more than 4 reads
// reach the device at once, however many the client pipelines.
func TestInFlightBytesBound(t *testing.T) {
	const n, bs = 32, 16 << 10
	mem := nbdtest.NewMemDevice(n * bs)
	mem.Delay = func(nbdtest.Op, int64, int64) { time.Sleep(time.Millisecond) }
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}, MaxInFlightBytes: 4 * bs})
	c, _ := pipe(t, s)
	c.handshakeGo("")
	go func() {
		for i := 0; i < n; i++ {
			c.request(wire.CmdRead, 0, uint64(i), uint64(i*bs), bs, nil)
		}
	}()
	for i := 0; i < n; i++ {
		if errno, _ := c.reply(); errno != 0 {
			t.Fatal(errno)
		}
		c.read(bs)
	}
	if st := mem.Stats(); st.MaxConcurrent > 4 || st.MaxConcurrent < 1 {
		t.Errorf("device saw %d reads at once, want at most 4", st.MaxConcurrent)
	}
}

// gate holds device writes until opened, and counts writes waiting at it.
type gate struct {
	open    chan struct{}
	mu      sync.Mutex // guards waiting
	waiting int
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) hold(op nbdtest.Op, _, _ int64) {
	if op != nbdtest.OpWrite {
		return
	}
	g.mu.Lock()
	g.waiting++
	g.mu.Unlock()
	<-g.open
}

func (g *gate) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		w := g.waiting
		g.mu.Unlock()
		if w >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes reached the device, want %d", w, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDiscDrainsWrites: writes in flight when NBD_CMD_DISC arrives are finished and replied
// to before the server closes the connection.
func TestDiscDrainsWrites(t *testing.T) {
	const n, bs = 8, 4096
	mem := nbdtest.NewMemDevice(n * bs)
	g := newGate()
	mem.Delay = g.hold
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}})
	c, done := pipe(t, s)
	c.handshakeGo("")
	model := make([]byte, n*bs)
	for i := 0; i < n; i++ {
		p := pattern(uint64(i), bs)
		copy(model[i*bs:], p)
		c.request(wire.CmdWrite, 0, uint64(i), uint64(i*bs), bs, p)
	}
	c.request(wire.CmdDisc, 0, 99, 0, 0, nil)
	g.waitFor(t, n)
	select {
	case <-done:
		t.Fatal("connection closed with writes in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(g.open)
	seen := make(map[uint64]bool)
	for i := 0; i < n; i++ {
		errno, cookie := c.reply()
		if errno != 0 || cookie >= n {
			t.Fatalf("reply errno %d cookie %d", errno, cookie)
		}
		seen[cookie] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct replies, want %d", len(seen), n)
	}
	c.expectClosed()
	<-done
	checkDevice(t, mem, model)
}

func TestErrnoOf(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want uint32
	}{
		{io.ErrUnexpectedEOF, wire.EIO},
		{errnoErr(wire.EPERM), wire.EPERM},
		{errnoErr(wire.ESHUTDOWN), wire.ESHUTDOWN},
		{errnoErr(wire.ENOTSUP), wire.EIO},
		{syscall.EFBIG, wire.ENOSPC},
		{syscall.EACCES, wire.EPERM},
		{syscall.EINVAL, wire.EINVAL},
		{syscall.EOVERFLOW, wire.EOVERFLOW},
		{fmt.Errorf("deep: %w", &wrapErr{syscall.ESHUTDOWN}), wire.ESHUTDOWN},
	} {
		if got := errnoOf(tt.err); got != tt.want {
			t.Errorf("errnoOf(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

func TestBufferSizeClasses(t *testing.T) {
	for _, n := range []int{1, 512, 4096, 4097, 65536, 1 << 20, 32 << 20, 32<<20 + 1} {
		b, _, err := mapBuffer(nil, classOf(n), n, false)
		if err != nil {
			t.Fatalf("mapBuffer(%d): %v", n, err)
		}
		if len(b.mem) < n || len(b.mem) != cap(b.mem) || len(b.mem)%pageSize != 0 {
			t.Errorf("mapBuffer(%d): len %d cap %d", n, len(b.mem), cap(b.mem))
		}
		if len(b.mem) > max(2*n, 4096) && n <= 1<<maxBufShift {
			t.Errorf("mapBuffer(%d): %d bytes is not the smallest class", n, len(b.mem))
		}
		if n > 1<<maxBufShift && (b.class != -1 || len(b.mem) > n+pageSize) {
			t.Errorf("mapBuffer(%d): class %d, %d bytes; want its own mapping", n, b.class, len(b.mem))
		}
		if addr := uintptr(unsafe.Pointer(unsafe.SliceData(b.mem))); addr%pageSize != 0 {
			t.Errorf("mapBuffer(%d) not page-aligned: %#x", n, addr)
		}
		b.mem[0], b.mem[len(b.mem)-1] = 1, 2 // writable, all of it
		b.unmap()
	}
}

// TestMixedWriteSizes sends, in one burst, WRITEs whose payloads straddle directReadMin (read
// through the buffered reader or straight from the connection, headers after a large write read
// on their own) interleaved with FLUSHes, so that headers and payloads land in the server's
// buffer at every possible split; every write must be acknowledged and every byte land.
func TestMixedWriteSizes(t *testing.T) {
	const size = 8 << 20
	mem := nbdtest.NewMemDevice(size)
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}})
	c, _ := unixConn(t, s)
	c.handshakeGo("")

	sizes := []int{512, directReadMin - 512, directReadMin, 48 << 10, 4096, 1 << 20,
		directReadMin + 512, 1024, 64<<10 + 512, 3 * 512}
	model := make([]byte, size)
	var burst []byte
	off, n := 0, 0
	for i := 0; off+sizes[i%len(sizes)] <= size && i < 200; i++ {
		l := sizes[i%len(sizes)]
		p := pattern(uint64(1000+i), l)
		copy(model[off:], p)
		b := make([]byte, wire.RequestHeaderSize)
		binary.BigEndian.PutUint32(b[0:], wire.MagicRequest)
		binary.BigEndian.PutUint16(b[6:], wire.CmdWrite)
		binary.BigEndian.PutUint64(b[8:], uint64(i))
		binary.BigEndian.PutUint64(b[16:], uint64(off))
		binary.BigEndian.PutUint32(b[24:], uint32(l))
		burst = append(append(burst, b...), p...)
		n++
		if i%7 == 3 {
			f := make([]byte, wire.RequestHeaderSize)
			binary.BigEndian.PutUint32(f[0:], wire.MagicRequest)
			binary.BigEndian.PutUint16(f[6:], wire.CmdFlush)
			binary.BigEndian.PutUint64(f[8:], uint64(100000+i))
			burst = append(burst, f...)
			n++
		}
		off += l
	}
	done := make(chan struct{})
	go func() { defer close(done); c.write(burst) }()
	for range n {
		if errno, cookie := c.reply(); errno != 0 {
			t.Fatalf("request %d: errno %d", cookie, errno)
		}
	}
	<-done
	checkDevice(t, mem, model)
}
