package nbd

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// pieceDevice is an in-memory Device and PlacedWriter with a unit of 64 KiB that records every
// placed piece and every WriteAt, and fails the commit of a piece at failAt.
type pieceDevice struct {
	mu     sync.Mutex
	mem    []byte
	tries  int        // PlaceWrite calls
	pieces [][2]int64 // off, n of each committed piece
	writes [][2]int64 // off, n of each WriteAt
	failAt int64      // a piece placed here fails its commit (-1: none)
	want   []byte     // the payload at wantAt, which PlacedReceived checks has arrived
	wantAt int64
	recv   []int  // PlacedReceived's counts
	bad    string // what PlacedReceived found wrong
}

// PlacedReceived (PlacedProgresser) records the count and checks that the bytes it covers of
// the piece have arrived.
func (d *pieceDevice) PlacedReceived(h any, received int) {
	pc := h.([2]int64) // d.mu is held, from PlaceWrite on
	d.recv = append(d.recv, received)
	at := pc[0] - d.wantAt
	switch {
	case received <= 0 || int64(received) >= pc[1]:
		d.bad = "a count outside the piece"
	case at < 0 || at+int64(received) > int64(len(d.want)):
		d.bad = "progress in a piece outside the WRITE checked"
	case !bytes.Equal(d.mem[pc[0]:pc[0]+int64(received)], d.want[at:at+int64(received)]):
		d.bad = "bytes it covers have not arrived"
	}
}

func (d *pieceDevice) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(p, d.mem[off:]), nil
}

func (d *pieceDevice) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes = append(d.writes, [2]int64{off, int64(len(p))})
	return copy(d.mem[off:], p), nil
}

func (d *pieceDevice) Size() (int64, error)                        { return int64(len(d.mem)), nil }
func (d *pieceDevice) Flush() error                                { return nil }
func (d *pieceDevice) Trim(off, length int64) error                { return nil }
func (d *pieceDevice) WriteZeroes(off, length int64, _ bool) error { return nil }
func (d *pieceDevice) PlaceUnit() int64                            { return 64 << 10 }

func (d *pieceDevice) PlaceWrite(off int64, n int, v [][]byte) ([][]byte, any, bool) {
	d.mu.Lock()
	d.tries++
	d.mu.Unlock()
	if off%(64<<10) != 0 || n < 64<<10 {
		return v, nil, false
	}
	d.mu.Lock() // held until CommitPlaced, as stripe locks are
	return append(v, d.mem[off:off+int64(n)]), [2]int64{off, int64(n)}, true
}

var errPiece = errors.New("piece failed")

func (d *pieceDevice) CommitPlaced(h any, received int, last bool) error {
	defer d.mu.Unlock()
	pc := h.([2]int64)
	d.pieces = append(d.pieces, pc)
	if pc[0] == d.failAt {
		return errPiece
	}
	return nil
}

func (d *pieceDevice) log() (pieces, writes [][2]int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([][2]int64(nil), d.pieces...), append([][2]int64(nil), d.writes...)
}

// directHeaders writes 64 KiB at 0 as the connection's first request and forgets it from dev's
// log: after a large WRITE the server reads the next request's header on its own, so that
// its buffered reader holds none of that request's payload, which can then be placed.
func directHeaders(t *testing.T, c *rawClient, dev *pieceDevice) {
	t.Helper()
	if e, _ := c.do(wire.CmdWrite, 0, 0, 64<<10, make([]byte, 64<<10)); e != 0 {
		t.Fatalf("the first WRITE: errno %d", e)
	}
	dev.mu.Lock()
	dev.tries, dev.pieces, dev.writes = 0, nil, nil
	dev.mu.Unlock()
}

// sendSlowly sends a WRITE of payload at off as the header and the first first bytes, then,
// after pause, the rest, and waits for the reply.
func sendSlowly(t *testing.T, c *rawClient, off uint64, payload []byte, first int, pause time.Duration) uint32 {
	t.Helper()
	var h [wire.RequestHeaderSize]byte
	wire.PutRequest(&h, 0, wire.CmdWrite, 7, off, uint32(len(payload)))
	c.write(append(h[:], payload[:first]...))
	time.Sleep(pause)
	c.write(payload[first:])
	errno, cookie := c.reply()
	if cookie != 7 {
		t.Fatalf("reply cookie %d, want 7", cookie)
	}
	return errno
}

// TestPlacedPieces: a WRITE whose payload arrives in two parts is placed in pieces of whole
// units as its bytes arrive; when the rest does not come within the wait, the rest is written
// as an ordinary WRITE of the remaining range, and one reply answers the whole; a piece that
// fails fails the WRITE, whose rest is dropped while the connection goes on. Every byte is
// compared.
func TestPlacedPieces(t *testing.T) {
	const size, n = 4 << 20, 512 << 10
	oldWait, oldStep := placedWait, placedStep
	t.Cleanup(func() { placedWait, placedStep = oldWait, oldStep })
	placedStep = 64 << 10 // one unit: pieces are read in steps
	for _, tc := range []struct {
		name   string
		wait   time.Duration // placedWait
		pause  time.Duration // the client's, after 200 KiB of the payload
		failAt int64
	}{
		{"waited", 20 * time.Second, 100 * time.Millisecond, -1},
		{"rest-as-usual", 100 * time.Millisecond, 800 * time.Millisecond, -1},
		{"piece-fails", 20 * time.Second, 0, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			placedWait = tc.wait
			dev := &pieceDevice{mem: make([]byte, size), failAt: tc.failAt}
			_, _, path := serveUnix(t, Options{Exports: []Export{{Name: "", Device: dev}}})
			c := dial(t, path)
			c.handshakeGo("")
			directHeaders(t, c, dev)
			off := uint64(1 << 20)
			want := pattern(5, n)
			dev.want, dev.wantAt = want, int64(off)
			errno := sendSlowly(t, c, off, want, 200<<10, tc.pause)
			pieces, writes := dev.log()
			t.Logf("pieces %v, writes %v", pieces, writes)
			if tc.failAt >= 0 {
				if errno != wire.EIO {
					t.Fatalf("a WRITE whose piece failed: errno %d, want EIO", errno)
				}
				if len(writes) != 0 || len(pieces) != 1 {
					t.Fatalf("the rest of a failed WRITE was written: pieces %v, writes %v", pieces, writes)
				}
				// The connection goes on: a WRITE and a READ of the same range.
				dev.mu.Lock()
				dev.failAt = -1
				dev.mu.Unlock()
				if e, _ := c.do(wire.CmdWrite, 0, off, n, want); e != 0 {
					t.Fatalf("the next WRITE: errno %d", e)
				}
			} else if errno != 0 {
				t.Fatalf("errno %d", errno)
			}
			// The pieces and ordinary writes tile the range in order, pieces in whole units.
			at := int64(off)
			for _, pc := range pieces {
				if pc[0] != at || pc[1]%(64<<10) != 0 && pc[0]+pc[1] != int64(off)+n {
					t.Fatalf("piece %v: want one at %d of whole units", pc, at)
				}
				at += pc[1]
				if at == int64(off)+n {
					break
				}
			}
			if tc.failAt < 0 { // (a failed WRITE's pieces were checked above)
				for _, w := range writes {
					if w[0] != at {
						t.Fatalf("ordinary write %v: want one at %d", w, at)
					}
					at += w[1]
				}
				if at != int64(off)+n {
					t.Fatalf("pieces and writes cover up to %d, want %d", at, int64(off)+n)
				}
			}
			switch tc.name {
			case "waited":
				if len(writes) != 0 || len(pieces) < 2 {
					t.Fatalf("a WRITE whose payload came in two parts within the wait: %d pieces, %d ordinary writes; want ≥ 2 pieces only", len(pieces), len(writes))
				}
			case "rest-as-usual":
				if len(pieces) == 0 || len(writes) != 1 {
					t.Fatalf("a WRITE whose rest came after the wait: %d pieces, %d ordinary writes; want pieces, then one write", len(pieces), len(writes))
				}
			}
			// A piece longer than a step (64 KiB) was read in steps, each step's progress
			// reported with its bytes in place. (How long the pieces are depends on how much
			// of the payload the socket had delivered when each was placed: a unix socket
			// may hand it over 64 KiB at a time, and then no piece has steps.)
			dev.mu.Lock()
			recv, bad := dev.recv, dev.bad
			dev.mu.Unlock()
			long := false
			for _, pc := range pieces {
				long = long || pc[1] > 64<<10
			}
			if long && len(recv) == 0 || bad != "" {
				t.Fatalf("pieces %v read in steps of 64 KiB: progress %v (%s)", pieces, recv, bad)
			}
			e, got := c.do(wire.CmdRead, 0, off, n, nil)
			if e != 0 || !bytes.Equal(got, want) {
				t.Fatalf("read back: errno %d, equal %v", e, bytes.Equal(got, want))
			}
		})
	}
}

// TestPlacedNoWholeUnit: a WRITE with no whole unit in it is written as usual at once: the
// reader neither waits for its payload nor offers it to the device.
func TestPlacedNoWholeUnit(t *testing.T) {
	old := placedWait
	t.Cleanup(func() { placedWait = old })
	placedWait = 20 * time.Second
	dev := &pieceDevice{mem: make([]byte, 1<<20), failAt: -1}
	_, _, path := serveUnix(t, Options{Exports: []Export{{Name: "", Device: dev}}})
	c := dial(t, path)
	c.handshakeGo("")
	want := pattern(6, 100<<10)
	if errno := sendSlowly(t, c, 4096, want, 1000, 200*time.Millisecond); errno != 0 {
		t.Fatalf("errno %d", errno)
	}
	dev.mu.Lock()
	tries, writes := dev.tries, dev.writes
	dev.mu.Unlock()
	if tries != 0 || len(writes) != 1 {
		t.Fatalf("a WRITE of 100 KiB at 4 KiB (no whole 64 KiB unit): %d PlaceWrite calls, ordinary writes %v; want none, one", tries, writes)
	}
	if e, got := c.do(wire.CmdRead, 0, 4096, uint32(len(want)), nil); e != 0 || !bytes.Equal(got, want) {
		t.Fatalf("read back: errno %d", e)
	}
}

// TestPlacedNotFromBuffer: a WRITE whose payload the connection's buffered reader already
// holds in part (read together with the request before it) is not placed: placing it would
// copy those bytes into the device's memory in user space, which the daemon's death can cut
// anywhere, tearing a 4 KiB unit (only the kernel copies into placed memory: PlacedWriter). A
// FLUSH and a 128 KiB WRITE sent in one go: the WRITE is written as usual, byte for byte.
func TestPlacedNotFromBuffer(t *testing.T) {
	dev := &pieceDevice{mem: make([]byte, 1<<20), failAt: -1}
	_, _, path := serveUnix(t, Options{Exports: []Export{{Name: "", Device: dev}}})
	c := dial(t, path)
	c.handshakeGo("")
	want := pattern(7, 128<<10)
	var fh, wh [wire.RequestHeaderSize]byte
	wire.PutRequest(&fh, 0, wire.CmdFlush, 1, 0, 0)
	wire.PutRequest(&wh, 0, wire.CmdWrite, 2, 64<<10, uint32(len(want)))
	c.write(append(append(fh[:], wh[:]...), want...))
	for range 2 {
		if errno, cookie := c.reply(); errno != 0 {
			t.Fatalf("request %d: errno %d", cookie, errno)
		}
	}
	pieces, writes := dev.log()
	if len(pieces) != 0 || len(writes) != 1 {
		t.Fatalf("a WRITE read in part with the FLUSH before it: pieces %v, ordinary writes %v; want none, one", pieces, writes)
	}
	// The next WRITE, its header read on its own after the large one, is placed.
	if e, _ := c.do(wire.CmdWrite, 0, 256<<10, uint32(len(want)), want); e != 0 {
		t.Fatalf("the next WRITE: errno %d", e)
	}
	if pieces, _ := dev.log(); len(pieces) == 0 {
		t.Fatal("the WRITE after a large one was not placed")
	}
	for _, off := range []uint64{64 << 10, 256 << 10} {
		if e, got := c.do(wire.CmdRead, 0, off, uint32(len(want)), nil); e != 0 || !bytes.Equal(got, want) {
			t.Fatalf("read back at %d: errno %d", off, e)
		}
	}
}
