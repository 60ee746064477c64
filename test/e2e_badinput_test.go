package test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// goodClient writes and reads back random data in [base, base+span) over its own connection
// until stop is closed (and it has done at least minOps round trips) or it reaches maxOps, then
// flushes and reads the whole span back. Every byte read must be what it wrote. It closes
// started after its first verified round trip (or when it gives up) and returns the number of
// round trips done.
func goodClient(sock string, base, span uint64, started chan<- struct{}, stop <-chan struct{}) (int, error) {
	const (
		minOps   = 50
		maxOps   = 20000
		deadline = 2 * time.Minute
	)
	startedOnce := sync.OnceFunc(func() { close(started) })
	defer startedOnce()
	c, err := wireConnect(sock)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	align := uint64(max(c.minBlock, 1))
	model := make([]byte, span) // what the span must hold; the array starts zeroed
	rng := rand.New(rand.NewPCG(7, 11))
	end := time.Now().Add(deadline)
	ops := 0
loop:
	for ; ops < maxOps && time.Now().Before(end); ops++ {
		if ops >= minOps {
			select {
			case <-stop:
				break loop
			default:
			}
		}
		// Odd sizes and offsets (in the server's minimum block), across chunk and stripe boundaries.
		n := align * (1 + rng.Uint64N(3*chunkSize/align))
		off := align * rng.Uint64N((span-n)/align+1)
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		if err := c.writeAt(p, base+off, ops%5 == 0); err != nil {
			return ops, fmt.Errorf("write %d bytes at %d: %w", n, base+off, err)
		}
		copy(model[off:], p)
		got, err := c.readAt(base+off, uint32(n))
		if err != nil {
			return ops, fmt.Errorf("read %d bytes at %d: %w", n, base+off, err)
		}
		if !bytes.Equal(got, p) {
			return ops, fmt.Errorf("read back %d bytes at %d: differs from what was written", n, base+off)
		}
		startedOnce()
	}
	if err := c.flush(); err != nil {
		return ops, fmt.Errorf("flush: %w", err)
	}
	got, err := c.readAt(base, uint32(span))
	if err != nil {
		return ops, fmt.Errorf("reading the span back: %w", err)
	}
	if i := firstDiff(got, model); i >= 0 {
		return ops, fmt.Errorf("span read back differs at byte %d (offset %d)", i, base+uint64(i))
	}
	return ops, c.disconnect()
}

// firstDiff returns the index of the first byte where a and b differ, or -1 if they are equal.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// logRecords returns the daemon's JSON log records written after the first skip bytes.
func logRecords(t *testing.T, logs string, skip int) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(logs[skip:], "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Errorf("daemon log line is not JSON (serve --log-format json): %q", line)
			continue
		}
		recs = append(recs, r)
	}
	return recs
}

// waitLogged waits until the daemon has logged, after the first skip bytes, a warning or error
// record (level WARN or ERROR, or an "err"/"error" attribute) whose text contains every word in
// words (case-insensitive), and fails the test if none comes. nbdkit logs differently: in
// stand-in mode the check is skipped.
func waitLogged(t *testing.T, s *server, skip int, why string, words ...string) {
	t.Helper()
	if standin {
		return
	}
	match := func() bool {
		for _, r := range logRecords(t, s.out.String(), skip) {
			_, hasErr := r["err"]
			_, hasError := r["error"]
			if lvl, _ := r["level"].(string); lvl != "WARN" && lvl != "ERROR" && !hasErr && !hasError {
				continue
			}
			text, _ := json.Marshal(r)
			ok := true
			for _, w := range words {
				ok = ok && strings.Contains(strings.ToLower(string(text)), strings.ToLower(w))
			}
			if ok {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(5 * time.Second)
	for !match() {
		if time.Now().After(deadline) {
			t.Errorf("the daemon logged no warning or error about %s (containing %q) after the connection closed:\n%s", why, words, s.out.String()[skip:])
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBadInput sends malformed and out-of-range traffic on raw connections while a well-behaved
// client writes and verifies data on another: the server must reply or close as the protocol
// says, log why it closed, keep the good client's every byte, and keep running.
func TestBadInput(t *testing.T) {
	a := newArray(t)
	s := a.serve(t)

	// The well-behaved client works far from where the bad ones aim.
	stop := make(chan struct{})
	type result struct {
		ops int
		err error
	}
	good := make(chan result, 1)
	started := make(chan struct{})
	go func() {
		ops, err := goodClient(s.sock, 100<<20, 4<<20, started, stop)
		good <- result{ops, err}
	}()
	<-started // the bad clients start while the good one is mid-stream
	goodDone := false
	finishGood := func() {
		if goodDone {
			return
		}
		goodDone = true
		close(stop)
		r := <-good
		if r.err != nil {
			t.Errorf("well-behaved client after %d round trips: %v", r.ops, r.err)
		} else {
			t.Logf("well-behaved client: %d write+read round trips, all verified", r.ops)
		}
	}
	t.Cleanup(finishGood)

	connect := func(t *testing.T) *wireClient {
		t.Helper()
		c, err := wireConnect(s.sock)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// stillUsable fails the test unless a read at the start of the array succeeds on c.
	stillUsable := func(t *testing.T, c *wireClient) {
		t.Helper()
		if _, err := c.readAt(0, 4096); err != nil {
			t.Fatalf("connection not usable after the error reply: %v", err)
		}
	}
	wantErrno := func(t *testing.T, what string, err error, want ...syscall.Errno) {
		t.Helper()
		var e nbdErrno
		if !errors.As(err, &e) {
			t.Fatalf("%s: %v, want an error reply (%v)", what, err, want)
		}
		for _, w := range want {
			if syscall.Errno(e) == w {
				return
			}
		}
		t.Errorf("%s: errno %d (%v), want %v", what, uint32(e), syscall.Errno(e), want)
	}

	t.Run("garbage magic closes", func(t *testing.T) {
		c := connect(t)
		mark := len(s.out.String())
		junk := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 7) // a 28-byte "request"
		if _, err := c.conn.Write(junk); err != nil {
			t.Fatal(err)
		}
		if got, err := c.waitClosed(); err != nil || len(got) != 0 {
			t.Fatalf("after garbage magic: sent %d bytes, %v; want the connection closed", len(got), err)
		}
		waitLogged(t, s, mark, "the bad magic", "magic")
	})

	t.Run("oversized write closes", func(t *testing.T) {
		c := connect(t)
		mark := len(s.out.String())
		// A 4 GiB - 512 payload the server cannot read without losing its footing; none follows.
		h, err := c.send(nbdCmdWrite, 0, 0, 0xffff_fe00, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.waitClosed()
		if err != nil {
			t.Fatalf("after an oversized write: %v; want the connection closed", err)
		}
		// The server may answer the request with an error before it closes; never success.
		if len(got) > 0 {
			if len(got) < 16 || binary.BigEndian.Uint32(got) != nbdSimpleReplyMag ||
				binary.BigEndian.Uint64(got[8:]) != h || binary.BigEndian.Uint32(got[4:]) == 0 {
				t.Errorf("before closing the server sent %x, want nothing or an error reply", got)
			}
		}
		waitLogged(t, s, mark, "the oversized request")
	})

	t.Run("read past the end is EINVAL", func(t *testing.T) {
		c := connect(t)
		if c.size != arraySize {
			t.Errorf("OPT_GO export size %d, want %d", c.size, int64(arraySize))
		}
		for _, r := range []struct {
			off uint64
			n   uint32
		}{
			{c.size - 512, 1024},     // straddles the end
			{c.size, 512},            // starts at the end
			{1 << 62, 4096},          // far beyond
			{^uint64(0) - 100, 4096}, // offset + length overflows
		} {
			_, err := c.readAt(r.off, r.n)
			wantErrno(t, fmt.Sprintf("read %d at %d", r.n, r.off), err, syscall.EINVAL)
			stillUsable(t, c)
		}
		// A write past the end is refused too, its payload consumed: the stream stays in sync.
		err := c.writeAt(bytes.Repeat([]byte{0x5a}, 4096), c.size-1024, false)
		wantErrno(t, "write past the end", err, syscall.ENOSPC, syscall.EINVAL)
		stillUsable(t, c)
		tail, err := c.readAt(c.size-1024, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tail, make([]byte, 1024)) {
			t.Errorf("a refused write past the end changed the last KiB of the array")
		}
	})

	t.Run("unknown command is EINVAL", func(t *testing.T) {
		c := connect(t)
		errno, _, err := c.do(0x55, 0, 0, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if syscall.Errno(errno) != syscall.EINVAL {
			t.Errorf("unknown command 0x55: errno %d (%v), want EINVAL", errno, syscall.Errno(errno))
		}
		stillUsable(t, c)
	})

	t.Run("unknown option then OPT_GO", func(t *testing.T) {
		c, err := wireDial(s.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const opt = 0x7f3e
		if err := c.sendOption(opt, []byte("some option data")); err != nil {
			t.Fatal(err)
		}
		gotOpt, typ, _, err := c.optionReply()
		if err != nil {
			t.Fatal(err)
		}
		if gotOpt != opt || typ != nbdRepErrUnsup {
			t.Errorf("reply to unknown option %#x: option %#x type %#x, want NBD_REP_ERR_UNSUP (%#x)", opt, gotOpt, typ, uint32(nbdRepErrUnsup))
		}
		if !standin { // nbdkit serves any export name
			var oe *optionError
			if err := c.optGo("no-such-export"); !errors.As(err, &oe) || oe.typ != nbdRepErrUnknown {
				t.Errorf("OPT_GO for an unknown export: %v, want NBD_REP_ERR_UNKNOWN", err)
			}
		}
		if err := c.optGo(""); err != nil {
			t.Fatalf("OPT_GO after the refused option: %v", err)
		}
		stillUsable(t, c)
	})

	finishGood()
	if !s.running() {
		t.Fatalf("the daemon exited: %v", s.err)
	}
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatalf("a new client after the bad ones: %v", err)
	}
	if _, err := c.readAt(100<<20, 4096); err != nil {
		t.Errorf("read on a new connection: %v", err)
	}
	if err := c.disconnect(); err != nil {
		t.Error(err)
	}
}
