package test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestStalledPayloads: 32 connections each send the header of a 32 MiB WRITE and 1 MiB of its
// payload, then nothing: together they announce the server's whole default in-flight budget
// (1 GiB). A well-behaved client's writes and reads (every byte compared) must get through
// while they stall, before any of them is closed; then each attacker must be closed once
// --payload-timeout has passed, with a log line giving its remote address and the bytes
// received of those expected. --idle-timeout (shorter) does not close them: a request is in
// flight.
// Before, the headers were charged to the budget in full, and the good client waited until
// the attackers left.
func TestStalledPayloads(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("stand-in mode: nbdkit has limits of its own")
	}
	const (
		attackers = 32
		length    = 32 << 20
		sent      = 1 << 20
		timeout   = 15 * time.Second // --payload-timeout: longer than the good client needs, by far
	)
	a := newArray(t)
	s := a.serve(t, "--payload-timeout", timeout.String(), "--idle-timeout", "5s")
	mark := len(s.out.String())

	payload := make([]byte, sent)
	for i := range payload {
		payload[i] = 0xa5
	}
	var wg sync.WaitGroup
	bad := make([]*wireClient, attackers)
	for i := range bad {
		c, err := wireConnect(s.sock)
		if err != nil {
			t.Fatalf("attacker %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		bad[i] = c
	}
	t.Cleanup(wg.Wait) // runs after the connections are closed
	sentAll := make(chan struct{}, attackers)
	start := time.Now()
	for i, c := range bad {
		b := binary.BigEndian.AppendUint32(nil, nbdRequestMagic)
		b = binary.BigEndian.AppendUint16(b, 0)
		b = binary.BigEndian.AppendUint16(b, nbdCmdWrite)
		b = binary.BigEndian.AppendUint64(b, uint64(i+1))
		b = binary.BigEndian.AppendUint64(b, 0)
		b = binary.BigEndian.AppendUint32(b, length)
		c.conn.SetDeadline(time.Now().Add(2 * time.Minute))
		wg.Go(func() {
			c.conn.Write(append(b, payload...)) // a server that does not read may block it
			sentAll <- struct{}{}
		})
	}
	// The good client comes once the attack is in (the server read every byte of it, before
	// the fix too).
	for i := range attackers {
		select {
		case <-sentAll:
		case <-time.After(time.Minute):
			t.Fatalf("only %d of %d attackers could send their header and payload", i, attackers)
		}
	}
	good, err := wireConnect(s.sock)
	if err != nil {
		t.Fatalf("good client: %v", err)
	}
	rng := rand.New(rand.NewPCG(3, 5))
	for i := range 8 {
		p := make([]byte, 256<<10)
		for k := range p {
			p[k] = byte(rng.Uint32())
		}
		off := uint64(64<<20) + uint64(i)*uint64(len(p))
		if err := good.writeAt(p, off, i%2 == 0); err != nil {
			t.Fatalf("good client, write %d while the attackers stall: %v", i, err)
		}
		got, err := good.readAt(off, uint32(len(p)))
		if err != nil {
			t.Fatalf("good client, read %d while the attackers stall: %v", i, err)
		}
		if j := firstDiff(got, p); j >= 0 {
			t.Fatalf("good client, read %d: differs at byte %d", i, j)
		}
	}
	if err := good.flush(); err != nil {
		t.Fatalf("good client, flush: %v", err)
	}
	if err := good.disconnect(); err != nil {
		t.Error(err)
	}
	if el := time.Since(start); el >= timeout {
		t.Fatalf("the good client's I/O took %v, past the payload deadline (%v): it cannot show that it did not wait for the attackers", el, timeout)
	}
	for i, c := range bad {
		c.conn.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := c.conn.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("attacker %d closed (%v) before the payload deadline", i, err)
		}
	}

	// Now every attacker is closed, at the deadline, with nothing sent back.
	for i, c := range bad {
		c.conn.SetReadDeadline(start.Add(timeout + 2*time.Minute))
		got, err := io.ReadAll(c.conn)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("attacker %d not closed: %v", i, err)
		}
		if len(got) > 0 {
			t.Errorf("attacker %d got %d bytes before the close, want none", i, len(got))
		}
	}
	if el := time.Since(start); el < timeout-time.Second {
		t.Errorf("attackers closed after %v, before the payload deadline of %v", el, timeout)
	}
	waitLogged(t, s, mark, "the stalled payloads", "payload", "PayloadTimeout")
	// Every line is logged before its connection closes, but the daemon's output reaches
	// s.out through a pipe read in the background: wait (bounded) for all of them.
	var n int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n = 0
		for _, r := range logRecords(t, s.out.String(), mark) {
			if r["limit"] == "PayloadTimeout" {
				n++
			}
		}
		if n >= attackers || time.Now().After(deadline) {
			break
		}
	}
	for _, r := range logRecords(t, s.out.String(), mark) {
		if r["limit"] != "PayloadTimeout" {
			continue
		}
		remote, _ := r["remote"].(string)
		if r["received"] != float64(sent) || r["expected"] != float64(length) || remote == "" {
			t.Errorf("stalled payload logged with remote %q, %v of %v bytes received; want an address, %d of %d",
				remote, r["received"], r["expected"], sent, length)
		}
	}
	if n != attackers {
		t.Errorf("%d stalled payloads logged, want %d", n, attackers)
	}
	if bytes.Contains([]byte(strings.ToLower(s.out.String()[mark:])), []byte("panic")) {
		t.Error("the daemon logged a panic")
	}

	// A large write goes through on a new connection: the budget is back.
	good, err = wireConnect(s.sock)
	if err != nil {
		t.Fatalf("good client after the attackers left: %v", err)
	}
	defer good.Close()
	big := make([]byte, length)
	for k := range big {
		big[k] = byte(rng.Uint32())
	}
	if err := good.writeAt(big, 0, true); err != nil {
		t.Fatalf("32 MiB write after the attackers left: %v", err)
	}
	got, err := good.readAt(0, length)
	if err != nil {
		t.Fatal(err)
	}
	if j := firstDiff(got, big); j >= 0 {
		t.Fatalf("32 MiB read back differs at byte %d", j)
	}
	if err := good.disconnect(); err != nil {
		t.Error(err)
	}
}
