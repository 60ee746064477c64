package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

var _ PinnedWriter = (*nbdtest.PinnedDevice)(nil)

// unixConn serves one connection of s over a unix socket (buffered, unlike net.Pipe) and
// returns the client end. done is closed when ServeConn has returned; cleanup waits for it.
func unixConn(t *testing.T, s *Server) (*rawClient, <-chan struct{}) {
	t.Helper()
	ln, path := unixListener(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		s.ServeConn(context.Background(), nc)
	}()
	c := dial(t, path)
	t.Cleanup(func() {
		c.nc.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServeConn did not return after the client closed")
		}
	})
	return c, done
}

// noBuffersLeft checks that every buffer is back and unmapped once the connections have ended.
func noBuffersLeft(t *testing.T, s *Server) {
	t.Helper()
	if st := s.BufferStats(); st.Mapped != 0 || st.Locked != 0 || st.Out != 0 || st.Pinned != 0 || st.PinnedBytes != 0 {
		t.Errorf("after the connection ended: %+v, want nothing mapped, out or pinned", st)
	}
}

// noReplyFor checks that no reply arrives within d.
func (c *rawClient) noReplyFor(d time.Duration) {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(d))
	_, err := c.r.Peek(1)
	c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("a reply arrived (or the connection broke: %v), want none", err)
	}
}

// TestStablePages pipelines rounds of writes of several sizes, some with FUA, against a device
// that holds each buffer until one of two goroutines releases it, at random and out of order,
// and reads everything back between rounds while buffers are still held. Every byte must be
// right, no held buffer reused or changed, every pin released once, and every buffer unmapped
// once the connection ends.
func TestStablePages(t *testing.T) {
	for _, debugImmutable := range []bool{false, true} {
		t.Run(fmt.Sprintf("DebugImmutable=%v", debugImmutable), func(t *testing.T) {
			const size = 1 << 20
			dev := nbdtest.NewPinnedDevice(size)
			s, _ := testServer(t, Options{
				Exports:             []Export{{Device: dev, StablePages: true}},
				MaxInFlightRequests: 16,
				DebugImmutable:      debugImmutable,
			})
			c, done := unixConn(t, s)
			c.handshakeGo("")

			stop := make(chan struct{})
			var releasers sync.WaitGroup
			for g := range 2 {
				r := rand.New(rand.NewPCG(uint64(g), 7))
				releasers.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						dev.Release(func(n int) int { return r.IntN(n) })
						time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
					}
				})
			}

			model := make([]byte, size)
			r := rand.New(rand.NewPCG(42, 42))
			maxHeld, fuaWrites := 0, 0
			for round := range 8 {
				bs := []int{4096, 12288, 65536, 512}[round%4]
				n := size / bs
				if bs == 512 {
					n = 256 // the first 128 KiB
				}
				payloads := make([][]byte, n)
				for i := range n {
					payloads[i] = pattern(uint64(round<<20+i), bs)
					copy(model[i*bs:], payloads[i])
					if i%17 == 0 {
						fuaWrites++
					}
				}
				sent := make(chan struct{})
				go func() {
					defer close(sent)
					for _, i := range r.Perm(n) {
						flags := uint16(0)
						if i%17 == 0 {
							flags = wire.CmdFlagFUA
						}
						c.request(wire.CmdWrite, flags, uint64(i), uint64(i*bs), uint32(bs), payloads[i])
					}
				}()
				for range n {
					if errno, _ := c.reply(); errno != 0 {
						t.Fatalf("round %d: WRITE errno %d", round, errno)
					}
				}
				<-sent
				maxHeld = max(maxHeld, len(dev.Held()))
				for off := 0; off < size; off += 64 << 10 {
					errno, got := c.do(wire.CmdRead, 0, uint64(off), 64<<10, nil)
					if errno != 0 {
						t.Fatalf("READ errno %d", errno)
					}
					if i := firstDiff(got, model[off:off+64<<10]); i >= 0 {
						t.Fatalf("round %d: READ at %d differs at byte %d", round, off, off+i)
					}
				}
			}
			close(stop)
			releasers.Wait()
			dev.ReleaseAll()
			c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
			<-done

			if err := dev.Err(); err != nil {
				t.Errorf("stable-pages contract broken:\n%v", err)
			}
			checkDevice(t, dev.MemDevice, model)
			st := s.BufferStats()
			if dev.Pins() == 0 || dev.Pins() != dev.Releases() || st.PinnedWrites != dev.Pins() {
				t.Errorf("%d WritePinned, %d releases, server counted %d; want equal and > 0",
					dev.Pins(), dev.Releases(), st.PinnedWrites)
			}
			if ds := dev.Stats(); ds.Writes != int64(fuaWrites) || ds.Flushes != int64(fuaWrites) {
				t.Errorf("FUA writes: %d WriteAt, %d Flush; want %d of each (FUA is never pinned)",
					ds.Writes, ds.Flushes, fuaWrites)
			}
			if maxHeld < 2 {
				t.Errorf("device held at most %d buffers after a round; the test did not exercise holding", maxHeld)
			}
			noBuffersLeft(t, s)
		})
	}
}

// TestStablePagesBound: buffers a device holds after their reply still count against the
// connection's MaxInFlightBytes, so a slow device stops the reader rather than making the
// server map more memory; requests without a buffer (FLUSH) are not held back.
func TestStablePagesBound(t *testing.T) {
	t.Run("writes stop at the bound", func(t *testing.T) {
		const bs, bound, n = 4096, 16 * 4096, 32
		dev := nbdtest.NewPinnedDevice(n * bs)
		s, _ := testServer(t, Options{
			Exports:          []Export{{Device: dev, StablePages: true}},
			MaxInFlightBytes: bound,
		})
		c, done := unixConn(t, s)
		c.handshakeGo("")
		model := make([]byte, n*bs)
		go func() {
			for i := range n {
				p := pattern(uint64(i), bs)
				copy(model[i*bs:], p) // before the send: the main goroutine reads model after the replies
				c.request(wire.CmdWrite, 0, uint64(i), uint64(i*bs), bs, p)
			}
		}()
		for range bound / bs {
			if errno, _ := c.reply(); errno != 0 {
				t.Fatal(errno)
			}
		}
		c.noReplyFor(100 * time.Millisecond)
		if dev.Pins() != bound/bs || len(dev.Held()) != bound/bs {
			t.Fatalf("%d WritePinned, %d held; want %d: the bound did not stop the reader",
				dev.Pins(), len(dev.Held()), bound/bs)
		}
		if st := s.BufferStats(); st.Mapped > 2*bound || st.PinnedBytes != bound {
			t.Errorf("at the bound: %+v; want at most %d bytes mapped, %d pinned", st, 2*bound, bound)
		}
		// Releasing four buffers lets exactly four more writes in.
		for range 4 {
			dev.Release(nil)
		}
		for range 4 {
			if errno, _ := c.reply(); errno != 0 {
				t.Fatal(errno)
			}
		}
		c.noReplyFor(50 * time.Millisecond)
		if dev.Pins() != bound/bs+4 {
			t.Fatalf("%d WritePinned after releasing 4, want %d", dev.Pins(), bound/bs+4)
		}
		for i := bound/bs + 4; i < n; i++ {
			dev.ReleaseAll()
			if errno, _ := c.reply(); errno != 0 {
				t.Fatal(errno)
			}
		}
		dev.ReleaseAll()
		c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
		<-done
		checkDevice(t, dev.MemDevice, model)
		if err := dev.Err(); err != nil {
			t.Error(err)
		}
		noBuffersLeft(t, s)
	})

	t.Run("flush passes, reads wait", func(t *testing.T) {
		const bound = 16 << 10
		dev := nbdtest.NewPinnedDevice(1 << 20)
		s, _ := testServer(t, Options{
			Exports:          []Export{{Device: dev, StablePages: true}},
			MaxInFlightBytes: bound,
		})
		c, done := unixConn(t, s)
		c.handshakeGo("")
		p := pattern(9, 64<<10) // larger than the bound: admitted alone, then held
		if errno, _ := c.do(wire.CmdWrite, 0, 0, uint32(len(p)), p); errno != 0 {
			t.Fatal(errno)
		}
		if errno, _ := c.do(wire.CmdFlush, 0, 0, 0, nil); errno != 0 {
			t.Fatalf("FLUSH errno %d", errno)
		}
		c.request(wire.CmdRead, 0, 1, 0, 4096, nil)
		c.noReplyFor(100 * time.Millisecond)
		dev.ReleaseAll()
		if errno, _ := c.reply(); errno != 0 {
			t.Fatalf("READ errno %d", errno)
		}
		if got := c.read(4096); !bytes.Equal(got, p[:4096]) {
			t.Error("READ after release returned the wrong bytes")
		}
		c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
		<-done
		noBuffersLeft(t, s)
	})
}

// TestStablePagesErrors: a failed WritePinned is answered with its error; the buffer goes back
// to the pool only when the device releases it, whether at once or later from another goroutine;
// a connection that ends while the device holds buffers waits for them.
func TestStablePagesErrors(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			dev := nbdtest.NewPinnedDevice(1 << 20)
			dev.Hold = func(off, n int64) bool { return hold }
			dev.Fail = func(op nbdtest.Op, off, n int64) error {
				if op == nbdtest.OpWrite && off == 4096 {
					return syscall.ENOSPC
				}
				return nil
			}
			s, _ := testServer(t, Options{Exports: []Export{{Device: dev, StablePages: true}}})
			c, done := unixConn(t, s)
			c.handshakeGo("")
			p := pattern(1, 4096)
			if errno, _ := c.do(wire.CmdWrite, 0, 4096, 4096, p); errno != wire.ENOSPC {
				t.Fatalf("failing WritePinned: errno %d, want ENOSPC", errno)
			}
			if errno, _ := c.do(wire.CmdWrite, 0, 8192, 4096, p); errno != 0 {
				t.Fatalf("WRITE after a failure: errno %d", errno)
			}
			want := int64(0)
			if hold {
				want = 2
			}
			if st := s.BufferStats(); st.Pinned != want {
				t.Fatalf("pinned %d, want %d", st.Pinned, want)
			}
			// The client leaves with the buffers still held: the connection waits for them.
			c.nc.Close()
			if hold {
				select {
				case <-done:
					t.Fatal("connection ended while the device held its buffers")
				case <-time.After(100 * time.Millisecond):
				}
				go dev.ReleaseAll()
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("connection did not end after the device released its buffers")
			}
			if dev.Pins() != 2 || dev.Releases() != 2 {
				t.Errorf("%d pins, %d releases; want 2 and 2", dev.Pins(), dev.Releases())
			}
			if err := dev.Err(); err != nil {
				t.Error(err)
			}
			noBuffersLeft(t, s)
		})
	}
}

// TestStablePagesPaths: which Device method a WRITE reaches, by option, device and FUA.
func TestStablePagesPaths(t *testing.T) {
	for _, tt := range []struct {
		name        string
		stable      bool
		pinnedDev   bool
		fua         bool
		wantPinned  bool
		wantFlushes bool
	}{
		{"off", false, true, false, false, false},
		{"on, device without WritePinned", true, false, false, false, false},
		{"on, FUA", true, true, true, false, true},
		{"on", true, true, false, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const n, bs = 8, 8192
			pdev := nbdtest.NewPinnedDevice(n * bs)
			mem := pdev.MemDevice
			var dev Device = pdev
			if !tt.pinnedDev {
				dev = mem
			}
			s, _ := testServer(t, Options{Exports: []Export{{Device: dev, StablePages: tt.stable}}})
			c, done := unixConn(t, s)
			c.handshakeGo("")
			model := make([]byte, n*bs)
			flags := uint16(0)
			if tt.fua {
				flags = wire.CmdFlagFUA
			}
			for i := range n {
				p := pattern(uint64(i), bs)
				copy(model[i*bs:], p)
				if errno, _ := c.do(wire.CmdWrite, flags, uint64(i*bs), bs, p); errno != 0 {
					t.Fatal(errno)
				}
			}
			pdev.ReleaseAll()
			c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
			<-done
			checkDevice(t, mem, model)
			st := mem.Stats()
			wantPins, wantWrites, wantFlushes := int64(0), int64(n), int64(0)
			if tt.wantPinned {
				wantPins, wantWrites = n, 0
			}
			if tt.wantFlushes {
				wantFlushes = n
			}
			if pdev.Pins() != wantPins || st.Writes != wantWrites || st.Flushes != wantFlushes {
				t.Errorf("%d WritePinned, %d WriteAt, %d Flush; want %d, %d, %d",
					pdev.Pins(), st.Writes, st.Flushes, wantPins, wantWrites, wantFlushes)
			}
			if got := s.BufferStats().PinnedWrites; got != wantPins {
				t.Errorf("server counted %d pinned writes, want %d", got, wantPins)
			}
			noBuffersLeft(t, s)
		})
	}
}

// writeFaults writes to p[i] and reports the fault address, or 0 if the write did not fault.
func writeFaults(p []byte, i int) (addr uintptr) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		fault, ok := r.(interface{ Addr() uintptr })
		if !ok {
			panic(r)
		}
		addr = fault.Addr()
	}()
	p[i] = ^p[i]
	return 0
}

// TestDebugImmutable: with DebugImmutable, a buffer the device holds is read-only: a write to
// it faults. Once released it is writable again and serves the next request.
func TestDebugImmutable(t *testing.T) {
	dev := nbdtest.NewPinnedDevice(1 << 20)
	s, _ := testServer(t, Options{
		Exports:        []Export{{Device: dev, StablePages: true}},
		DebugImmutable: true,
	})
	c, done := unixConn(t, s)
	c.handshakeGo("")
	p := pattern(3, 4096)
	if errno, _ := c.do(wire.CmdWrite, 0, 0, 4096, p); errno != 0 {
		t.Fatal(errno)
	}
	held := dev.Held()
	if len(held) != 1 {
		t.Fatalf("%d buffers held, want 1", len(held))
	}
	b := held[0].P
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if addr := writeFaults(b, 100); addr != base+100 {
		t.Fatalf("write to a held buffer: fault at %#x, want one at %#x", addr, base+100)
	}
	if !bytes.Equal(b, p) {
		t.Fatal("held buffer changed")
	}
	dev.Release(nil)
	// The request's own reference goes after its reply is written: wait for the buffer to be
	// back in the pool (finish makes it writable before it counts it back).
	for deadline := time.Now().Add(10 * time.Second); s.BufferStats().Out != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("buffer not back in the pool: %+v", s.BufferStats())
		}
	}
	// Back in the pool: writable, and (the only free 4 KiB buffer) the next request's.
	if addr := writeFaults(b, 100); addr != 0 {
		t.Fatalf("write to a released buffer faulted at %#x", addr)
	}
	q := pattern(4, 4096)
	if errno, _ := c.do(wire.CmdWrite, 0, 4096, 4096, q); errno != 0 {
		t.Fatal(errno)
	}
	held = dev.Held()
	if len(held) != 1 || unsafe.SliceData(held[0].P) != unsafe.SliceData(b) {
		t.Fatal("the released buffer was not reused for the next write")
	}
	if addr := writeFaults(held[0].P, 0); addr != base {
		t.Fatalf("write to the reused, held buffer: fault at %#x, want %#x", addr, base)
	}
	dev.ReleaseAll()
	c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
	<-done
	if got := dev.Bytes()[:8192]; !bytes.Equal(got[:4096], p) || !bytes.Equal(got[4096:], q) {
		t.Error("device bytes differ")
	}
	if err := dev.Err(); err != nil {
		t.Error(err)
	}
	noBuffersLeft(t, s)
}

// releaseTwice is a PinnedWriter that breaks the contract: it calls release twice.
type releaseTwice struct {
	*nbdtest.MemDevice
	panicked chan any
}

func (d releaseTwice) WritePinned(p []byte, off int64, release func()) (int, error) {
	release()
	func() {
		defer func() { d.panicked <- recover() }()
		release()
	}()
	return d.WriteAt(p, off)
}

func TestReleaseTwicePanics(t *testing.T) {
	dev := releaseTwice{nbdtest.NewMemDevice(1 << 20), make(chan any, 1)}
	s, _ := testServer(t, Options{Exports: []Export{{Device: dev, StablePages: true}}})
	c, done := unixConn(t, s)
	c.handshakeGo("")
	if errno, _ := c.do(wire.CmdWrite, 0, 0, 4096, pattern(1, 4096)); errno != 0 {
		t.Fatal(errno)
	}
	if r := <-dev.panicked; r == nil {
		t.Error("a second release did not panic")
	}
	c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
	<-done
	noBuffersLeft(t, s)
}

// vmLocked returns VmLck of /proc/self/status in bytes.
func vmLocked(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmLck:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

func TestMlockBuffers(t *testing.T) {
	t.Run("locks", func(t *testing.T) {
		if checkMemlock(DefaultMaxInFlightBytes+DefaultMaxBlock) != nil {
			t.Skip("this process may not lock 96 MiB (no CAP_IPC_LOCK, RLIMIT_MEMLOCK low)")
		}
		dev := nbdtest.NewPinnedDevice(1 << 20)
		s, _ := testServer(t, Options{
			Exports:      []Export{{Device: dev, StablePages: true}},
			MlockBuffers: true,
		})
		c, done := unixConn(t, s)
		c.handshakeGo("")
		before := vmLocked(t)
		for i := range 4 {
			if errno, _ := c.do(wire.CmdWrite, 0, uint64(i)<<16, 64<<10, pattern(uint64(i), 64<<10)); errno != 0 {
				t.Fatal(errno)
			}
		}
		st := s.BufferStats()
		if st.Mapped < 4*64<<10 || st.Locked != st.Mapped {
			t.Errorf("%+v: want every mapped byte (at least 4 held 64 KiB buffers) locked", st)
		}
		if got := vmLocked(t); got < before+st.Locked {
			t.Errorf("VmLck %d bytes (%d before the writes), want at least %d more", got, before, st.Locked)
		}
		dev.ReleaseAll()
		c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
		<-done
		noBuffersLeft(t, s)
	})
	t.Run("limit too low", func(t *testing.T) {
		var old unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
			t.Fatal(err)
		}
		low := old
		low.Cur = 64 << 10
		if old.Max < low.Cur {
			low.Cur = old.Max
		}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &low); err != nil {
			t.Fatal(err)
		}
		defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
		cap := hasCapIPCLock
		hasCapIPCLock = func() bool { return false }
		defer func() { hasCapIPCLock = cap }()

		opts := Options{Exports: []Export{{Device: nbdtest.NewMemDevice(1 << 20)}}, MlockBuffers: true}
		if _, err := NewServer(opts); !errors.Is(err, ErrMemlockLimit) {
			t.Errorf("NewServer with MlockBuffers and RLIMIT_MEMLOCK %d: %v, want ErrMemlockLimit", low.Cur, err)
		}
		opts.MlockBuffers = false
		if _, err := NewServer(opts); err != nil {
			t.Errorf("NewServer without MlockBuffers: %v", err)
		}
		hasCapIPCLock = func() bool { return true }
		opts.MlockBuffers = true
		if _, err := NewServer(opts); err != nil {
			t.Errorf("NewServer with CAP_IPC_LOCK: %v", err)
		}
	})
}

// TestMapFailure: when no buffer can be mapped, the request is refused with EIO and the
// connection carries on.
func TestMapFailure(t *testing.T) {
	mem := nbdtest.NewMemDevice(1 << 20)
	s, _ := testServer(t, Options{Exports: []Export{{Device: mem}}})
	c, done := unixConn(t, s)
	c.handshakeGo("")
	mmapFunc = func(int, int64, int, int, int) ([]byte, error) { return nil, syscall.ENOMEM }
	p := pattern(5, 8192)
	errW, _ := c.do(wire.CmdWrite, 0, 0, 8192, p)
	errR, _ := c.do(wire.CmdRead, 0, 0, 4096, nil)
	mmapFunc = unix.Mmap
	if errW != wire.EIO || errR != wire.EIO {
		t.Errorf("without memory: WRITE errno %d, READ errno %d; want EIO", errW, errR)
	}
	if errno, _ := c.do(wire.CmdWrite, 0, 0, 8192, p); errno != 0 {
		t.Fatalf("WRITE once memory is back: errno %d", errno)
	}
	c.request(wire.CmdDisc, 0, 0, 0, 0, nil)
	<-done
	if st := mem.Stats(); st.Writes != 1 || st.Reads != 0 {
		t.Errorf("device saw %+v; want only the last write", st)
	}
	noBuffersLeft(t, s)
}
