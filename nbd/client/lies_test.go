package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/client"
)

// goHandshake plays a fixed-newstyle server's side of the handshake on nc: the greeting, then
// NBD_OPT_GO answered with NBD_INFO_EXPORT (size, flags) and an acknowledgement.
func goHandshake(nc net.Conn, size uint64, flags uint16) {
	nc.Write(greeting(3))
	readN(nc, 4)
	h := readN(nc, 16)
	readN(nc, int(binary.BigEndian.Uint32(h[12:16])))
	nc.Write(goReply(infoExport(size, flags)))
}

// greeting is a newstyle server's greeting with handshake flags hflags.
func greeting(hflags uint16) []byte {
	g := binary.BigEndian.AppendUint64(nil, 0x4e42444d41474943)
	g = binary.BigEndian.AppendUint64(g, 0x49484156454f5054)
	return binary.BigEndian.AppendUint16(g, hflags)
}

// infoExport is the data of an NBD_INFO_EXPORT reply.
func infoExport(size uint64, flags uint16) []byte {
	d := binary.BigEndian.AppendUint16(nil, 0)
	d = binary.BigEndian.AppendUint64(d, size)
	return binary.BigEndian.AppendUint16(d, flags)
}

// goReply is the answer to NBD_OPT_GO: an NBD_REP_INFO with each of infos, then NBD_REP_ACK.
func goReply(infos ...[]byte) []byte {
	var out []byte
	for _, d := range append(infos, nil) {
		typ := uint32(1) // NBD_REP_ACK
		if d != nil {
			typ = 3 // NBD_REP_INFO
		}
		out = binary.BigEndian.AppendUint64(out, 0x3e889045565a9)
		out = binary.BigEndian.AppendUint32(out, 7)
		out = binary.BigEndian.AppendUint32(out, typ)
		out = binary.BigEndian.AppendUint32(out, uint32(len(d)))
		out = append(out, d...)
	}
	return out
}

// simpleReply is a simple reply to the request header req, with errno and payload.
func simpleReply(req []byte, errno uint32, payload []byte) []byte {
	rep := binary.BigEndian.AppendUint32(nil, 0x67446698)
	rep = binary.BigEndian.AppendUint32(rep, errno)
	rep = append(rep, req[8:16]...)
	return append(rep, payload...)
}

// TestDuplicateReply: a server that answers a READ twice (a lying or broken member server)
// breaks the connection; the second answer is never taken for the next request that reuses
// the slot, which would return success with data the server never sent (a READ into a buffer
// left as it was), and never lands in the first caller's buffer after its ReadAt returned.
// One request in flight at a time, so the next request reuses the slot; repeated, because the
// old code took the duplicate only when its reader got to it before the first caller had
// released the slot.
func TestDuplicateReply(t *testing.T) {
	first, second := bytes.Repeat([]byte{0x11}, 512), bytes.Repeat([]byte{0x22}, 512)
	for i := range 200 {
		cc := fakeServer(t, func(nc net.Conn) {
			goHandshake(nc, 1<<20, client.FlagHasFlags)
			req := readN(nc, 28)
			rep := simpleReply(req, 0, first)
			nc.Write(append(rep, rep...)) // the READ answered twice, in one write
			req = readN(nc, 28)
			if len(req) == 28 && req[7] == 0 { // a READ: answer it truly
				nc.Write(simpleReply(req, 0, second))
			}
			readN(nc, 28)
		})
		c, err := client.NewConn(context.Background(), cc, "", client.Options{MaxInFlight: 1})
		if err != nil {
			t.Fatal(err)
		}
		p1 := make([]byte, 512)
		if _, err := c.ReadAt(p1, 0); err != nil || !bytes.Equal(p1, first) {
			t.Fatalf("round %d: first ReadAt: %v, data %x...", i, err, p1[:4])
		}
		p2 := make([]byte, 512)
		_, err = c.ReadAt(p2, 512)
		if err == nil {
			t.Fatalf("round %d: ReadAt after a duplicated reply succeeded (data %x..., the server's %x...): the duplicate answered it", i, p2[:4], second[:4])
		}
		if !errors.Is(err, client.ErrDisconnected) {
			t.Fatalf("round %d: ReadAt after a duplicated reply: %v, want ErrDisconnected", i, err)
		}
		c.Close()
		if !bytes.Equal(p1, first) {
			t.Fatalf("round %d: the first ReadAt's buffer changed after it returned: %x...", i, p1[:4])
		}
	}
}

// TestTruncatedReadPayload: a server that sends a READ's reply header and then only part of
// its payload before closing fails that ReadAt with ErrDisconnected (it does not hang, and
// does not return the part as data).
func TestTruncatedReadPayload(t *testing.T) {
	cc := fakeServer(t, func(nc net.Conn) {
		goHandshake(nc, 1<<20, client.FlagHasFlags)
		req := readN(nc, 28)
		nc.Write(simpleReply(req, 0, bytes.Repeat([]byte{0x33}, 100)))
	})
	c, err := client.NewConn(context.Background(), cc, "", client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.ReadAt(make([]byte, 512), 0)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrDisconnected) {
			t.Fatalf("ReadAt with its payload cut short: %v, want ErrDisconnected", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ReadAt with its payload cut short still waiting after 20 s")
	}
}

// TestLyingReadReplies: a READ answered with a reply no honest server sends fails, and never
// hands data on: an error flag on a reply that carries a payload anyway (the error is
// returned, the payload is not data: it is then read as the next reply's header and breaks the
// connection), a structured reply (not negotiated), a payload cut short on the direct path
// (a large READ read straight into the caller's buffer) or the buffered one, a reply whose
// cookie names no request. The next request on the connection fails with ErrDisconnected.
// Over a socket (the reply reader's read(2)/readv(2) paths) and a net.Pipe (its bufio path, as
// under TLS).
func TestLyingReadReplies(t *testing.T) {
	for _, transport := range []string{"socket", "pipe"} {
		for _, vectored := range []bool{false, true} {
			name := transport
			if vectored {
				name += "-vectored"
			}
			t.Run(name, func(t *testing.T) { testLyingReadReplies(t, transport, vectored) })
		}
	}
}

// serveOn runs fn as the server side of a socket pair (socket) or a net.Pipe and returns the
// client side; the server side is closed when fn returns.
func serveOn(t *testing.T, transport string, fn func(nc net.Conn)) net.Conn {
	if transport == "pipe" {
		return fakeServer(t, fn)
	}
	cc, sc := socketPair(t)
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
	sc.SetDeadline(time.Now().Add(10 * time.Second))
	return cc
}

// testLyingReadReplies reads with ReadAt, or with vectored ReadvAt into buffers of a quarter,
// a quarter and a half of the READ (one readv(2) over them all on a socket).
func testLyingReadReplies(t *testing.T, transport string, vectored bool) {
	const eio = 5
	for _, tc := range []struct {
		name  string
		n     int
		reply func(req []byte) []byte
	}{
		{"error-with-payload", 4096, func(req []byte) []byte {
			return simpleReply(req, eio, bytes.Repeat([]byte{0x44}, 4096))
		}},
		{"error-with-large-payload", 64 << 10, func(req []byte) []byte {
			return simpleReply(req, eio, bytes.Repeat([]byte{0x44}, 64<<10))
		}},
		{"structured", 4096, func(req []byte) []byte {
			rep := binary.BigEndian.AppendUint32(nil, 0x668e33ef) // NBD_STRUCTURED_REPLY_MAGIC
			rep = binary.BigEndian.AppendUint16(rep, 1)           // NBD_REPLY_FLAG_DONE
			rep = binary.BigEndian.AppendUint16(rep, 1)           // NBD_REPLY_TYPE_OFFSET_DATA
			rep = append(rep, req[8:16]...)
			rep = binary.BigEndian.AppendUint32(rep, 8+4096)
			rep = binary.BigEndian.AppendUint64(rep, 0)
			return append(rep, bytes.Repeat([]byte{0x44}, 4096)...)
		}},
		{"short-direct", 64 << 10, func(req []byte) []byte {
			return simpleReply(req, 0, bytes.Repeat([]byte{0x44}, 20<<10))
		}},
		{"short-buffered", 8 << 10, func(req []byte) []byte {
			return simpleReply(req, 0, bytes.Repeat([]byte{0x44}, 3<<10))
		}},
		{"unknown-cookie", 4096, func(req []byte) []byte {
			rep := simpleReply(req, 0, bytes.Repeat([]byte{0x44}, 4096))
			rep[8] ^= 0x80
			return rep
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := serveOn(t, transport, func(nc net.Conn) {
				goHandshake(nc, 1<<20, client.FlagHasFlags)
				req := readN(nc, 28)
				nc.Write(tc.reply(req))
				// A payload cut short: the server closes the connection. Else it answers
				// nothing more, and reads requests until the client breaks the connection.
				if strings.HasPrefix(tc.name, "short") {
					return
				}
				readN(nc, 28)
				readN(nc, 28)
			})
			c, err := client.NewConn(context.Background(), cc, "", client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			p := make([]byte, tc.n)
			done := make(chan error, 1)
			go func() {
				var err error
				if vectored {
					q := len(p) / 4
					_, err = c.ReadvAt([][]byte{p[:q], p[q : 2*q], p[2*q:]}, 0)
				} else {
					_, err = c.ReadAt(p, 0)
				}
				done <- err
			}()
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("ReadAt still waiting after 20 s")
			}
			if err == nil {
				t.Fatalf("ReadAt succeeded (data %x...)", p[:4])
			}
			if !bytes.Equal(p, make([]byte, tc.n)) && !strings.HasPrefix(tc.name, "short") {
				t.Fatalf("ReadAt failed (%v) but wrote the reply's bytes into the buffer", err)
			}
			go func() { _, err := c.ReadAt(make([]byte, 512), 0); done <- err }()
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the next ReadAt still waiting after 20 s")
			}
			if !errors.Is(err, client.ErrDisconnected) {
				t.Fatalf("the next ReadAt: %v, want ErrDisconnected", err)
			}
		})
	}
}

// TestVectoredDribbled: READ replies to vectored reads whose payloads come from the socket in
// pieces of any size — some in one write with the reply before, some a few bytes at a time —
// fill every buffer of every ReadvAt, whatever their sizes (empty, below and above the reply
// reader's direct reads, up to 2 MiB in all), with exactly the bytes at their offsets; many
// in flight at once, over a unix socket (the reader's readv(2) path: net.Pipe has no
// descriptor).
func TestVectoredDribbled(t *testing.T) {
	const size = 64 << 20
	pat := func(off int64) byte { return byte(off*7 + off>>9 + off>>17) }
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		goHandshake(nc, size, client.FlagHasFlags)
		reqs := make(chan []byte, 256)
		go func() {
			defer close(reqs)
			for {
				req := readN(nc, 28)
				if binary.BigEndian.Uint32(req[:4]) != 0x25609513 || req[7] != 0 { // DISC, or gone
					return
				}
				reqs <- req
			}
		}()
		rng := rand.New(rand.NewPCG(3, 4))
		var out []byte
		for req := range reqs {
			off, n := int64(binary.BigEndian.Uint64(req[16:24])), int(binary.BigEndian.Uint32(req[24:28]))
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = pat(off + int64(i))
			}
			out = append(out, simpleReply(req, 0, payload)...)
			// With another request waiting, keep a random tail to go out with its reply.
			keep := 0
			if len(reqs) > 0 && rng.IntN(3) == 0 {
				keep = rng.IntN(len(out))
			}
			w := out[:len(out)-keep]
			for len(w) > 0 {
				k := min(len(w), 1+rng.IntN([]int{7, 100, 5000, 70000, 300000}[rng.IntN(5)]))
				if _, err := nc.Write(w[:k]); err != nil {
					return
				}
				w = w[k:]
				if rng.IntN(8) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
			}
			out = append(out[:0], out[len(out)-keep:]...)
		}
	}()
	nc, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewConn(context.Background(), nc, "", client.Options{})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	defer c.Close()
	sizes := []int{0, 1, 511, 4096, 16<<10 - 1, 16 << 10, 40 << 10, 64 << 10, 300 << 10}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for range 20 {
				bufs := make([][]byte, 1+rng.IntN(8))
				total := 0
				for i := range bufs {
					bufs[i] = make([]byte, sizes[rng.IntN(len(sizes))])
					total += len(bufs[i])
				}
				off := int64(rng.IntN(size - total + 1))
				if n, err := c.ReadvAt(bufs, off); n != total || err != nil {
					errs <- fmt.Errorf("ReadvAt of %d bytes at %d = %d, %v", total, off, n, err)
					return
				}
				at := off
				for i, b := range bufs {
					for j := range b {
						if b[j] != pat(at) {
							errs <- fmt.Errorf("ReadvAt of %d buffers at %d: buffer %d (%d bytes) byte %d is %#x, want %#x", len(bufs), off, i, len(b), j, b[j], pat(at))
							return
						}
						at++
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
