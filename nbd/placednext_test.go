package nbd

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// header encodes one request header.
func header(typ uint16, cookie, off uint64, length int) []byte {
	var h [wire.RequestHeaderSize]byte
	wire.PutRequest(&h, 0, typ, cookie, off, uint32(length))
	return h[:]
}

// readReplies reads n simple replies in any order and returns their errnos and the payloads of
// the READs among them (reads: a READ's cookie → its length).
func readReplies(c *rawClient, n int, reads map[uint64]int) (map[uint64]uint32, map[uint64][]byte) {
	c.t.Helper()
	errnos, data := map[uint64]uint32{}, map[uint64][]byte{}
	for range n {
		errno, cookie := c.reply()
		if _, dup := errnos[cookie]; dup {
			c.t.Fatalf("two replies for cookie %d", cookie)
		}
		errnos[cookie] = errno
		if l, ok := reads[cookie]; ok && errno == 0 {
			data[cookie] = c.read(l)
		}
	}
	return errnos, data
}

// TestPlacedNextHeader: the read that ends a placed WRITE's payload also takes what has
// arrived of the next request's header (placedReader.next), and the header's read takes only
// the rest. Wherever the client's sends cut the next header — none of it, a part, all of it
// with the payload — the requests after a placed WRITE are served right, and a WRITE whose
// header came in parts is still placed. Every byte is compared.
func TestPlacedNextHeader(t *testing.T) {
	const unit = 64 << 10
	old := placedWait
	t.Cleanup(func() { placedWait = old })
	placedWait = 20 * time.Second // a header read ahead waits for its payload as one read alone did
	for _, split := range []int{0, 1, 13, 27, 28} {
		t.Run(fmt.Sprint(split), func(t *testing.T) {
			dev := &pieceDevice{mem: make([]byte, 4<<20), failAt: -1}
			_, _, path := serveUnix(t, Options{Exports: []Export{{Name: "", Device: dev}}})
			c := dial(t, path)
			c.handshakeGo("")
			directHeaders(t, c, dev)
			a, b := pattern(uint64(10+split), 2*unit), pattern(uint64(20+split), 3*unit)
			const offA, offB = 1 << 20, 2 << 20
			hb := header(wire.CmdWrite, 2, offB, len(b))
			// WRITE a, and split bytes of the next WRITE's header; the rest, b, and READs of
			// both after a pause in which the server has read a and what came of the header.
			var first []byte
			first = append(first, header(wire.CmdWrite, 1, offA, len(a))...)
			first = append(first, a...)
			c.write(append(first, hb[:split]...))
			time.Sleep(50 * time.Millisecond)
			var rest []byte
			rest = append(rest, hb[split:]...)
			rest = append(rest, b...)
			rest = append(rest, header(wire.CmdRead, 3, offA, len(a))...)
			rest = append(rest, header(wire.CmdRead, 4, offB, len(b))...)
			c.write(rest)
			errnos, data := readReplies(c, 4, map[uint64]int{3: len(a), 4: len(b)})
			for cookie, e := range errnos {
				if e != 0 {
					t.Fatalf("request %d: errno %d", cookie, e)
				}
			}
			if !bytes.Equal(data[3], a) || !bytes.Equal(data[4], b) {
				t.Fatalf("read back: a equal %v, b equal %v", bytes.Equal(data[3], a), bytes.Equal(data[4], b))
			}
			// Both WRITEs placed, in pieces as their bytes arrived.
			pieces, writes := dev.log()
			at, w := int64(offA), 0
			for _, pc := range pieces {
				if at == offA+int64(len(a)) {
					at, w = offB, 1
				}
				if pc[0] != at {
					break
				}
				at += pc[1]
			}
			if len(writes) != 0 || w != 1 || at != offB+int64(len(b)) {
				t.Fatalf("pieces %v, ordinary writes %v; want both WRITEs placed", pieces, writes)
			}
		})
	}
}

// TestPlacedKnownArrived: the reader remembers how much the socket's receive queue held (the
// last SIOCINQ) less what it read since, so a run of placed WRITEs does not ask for every
// piece; the count must not overstate what has arrived. A WRITE sent with the placed WRITE
// before it (and, in the second case, a FUA WRITE between them, which is read as usual) but
// only 120 KiB of its payload, the rest after a pause, is placed no further than those 120
// KiB before the pause: a count not lowered by every read would place it whole and wait for
// the client with the device's lock held. (The WRITE is short enough that all of its payload
// is within the count as it was when the WRITE before was placed.)
func TestPlacedKnownArrived(t *testing.T) {
	const unit = 64 << 10
	old := placedStep
	t.Cleanup(func() { placedStep = old })
	placedStep = 1 << 30 // a whole piece per read: progress only when a read comes up short
	for _, between := range []int{0, 16 << 10} {
		t.Run(fmt.Sprint(between), func(t *testing.T) {
			dev := &pieceDevice{mem: make([]byte, 4<<20), failAt: -1}
			_, _, path := serveUnix(t, Options{Exports: []Export{{Name: "", Device: dev}}})
			c := dial(t, path)
			c.handshakeGo("")
			directHeaders(t, c, dev)
			// Small enough that all that is sent before the pause fits in the socket's buffer
			// (the count is then all of it); what is sent of b ends inside a unit, closer to
			// the next unit's start than the FUA WRITE's length.
			a, b, f := pattern(31, unit), pattern(32, 2*unit), pattern(33, between)
			const offA, offB, offF, sent = 1 << 20, 2 << 20, 3 << 20, 120 << 10
			dev.want, dev.wantAt = b, offB // a piece of b read in parts is checked as it arrives
			var first []byte
			first = append(first, header(wire.CmdWrite, 1, offA, len(a))...)
			first = append(first, a...)
			if between > 0 {
				var h [wire.RequestHeaderSize]byte
				wire.PutRequest(&h, wire.CmdFlagFUA, wire.CmdWrite, 3, offF, uint32(between))
				first = append(append(first, h[:]...), f...)
			}
			first = append(first, header(wire.CmdWrite, 2, offB, len(b))...)
			c.write(append(first, b[:sent]...))
			time.Sleep(100 * time.Millisecond)
			c.write(b[sent:])
			n := 2
			if between > 0 {
				n = 3
			}
			errnos, _ := readReplies(c, n, nil)
			for cookie, e := range errnos {
				if e != 0 {
					t.Fatalf("request %d: errno %d", cookie, e)
				}
			}
			pieces, writes := dev.log()
			t.Logf("pieces %v, ordinary writes %v", pieces, writes)
			for _, pc := range pieces {
				if pc[0] == offB && pc[1] > sent {
					t.Fatalf("the WRITE's first piece %v is longer than the %d bytes sent before the pause", pc, sent)
				}
			}
			for _, w := range []struct {
				off  uint64
				want []byte
			}{{offA, a}, {offB, b}, {offF, f}} {
				if e, got := c.do(wire.CmdRead, 0, w.off, uint32(len(w.want)), nil); e != 0 || !bytes.Equal(got, w.want) {
					t.Fatalf("read back at %d: errno %d", w.off, e)
				}
			}
		})
	}
}
