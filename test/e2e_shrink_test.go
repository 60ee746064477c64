package test

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"testing"
)

// A member file truncated under a running daemon (issue 13, item 2): the lost range is a
// failing member's, read back from parity, never zeroes.

// shrinkCut is where the tests truncate member 1: 16 MiB and 1000 bytes into its data area,
// inside a page, so that the page the cut falls in still maps and reads as zeroes past it.
const shrinkCut = dataOffset + 16<<20 + 1000

// filledArray creates an array, writes it whole with random data through NBD, flushes, and
// stops the daemon, so that the next one starts with a cold cache. It returns the array and
// the data.
func filledArray(t *testing.T) (*array, []byte) {
	t.Helper()
	a := newArray(t)
	model := make([]byte, arraySize)
	rng := rand.New(rand.NewPCG(13, 2))
	for i := 0; i < len(model); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			model[i+j] = byte(v >> (8 * j))
		}
	}
	s := a.serve(t)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	const piece = 4 << 20
	for off := 0; off < len(model); off += piece {
		if err := c.writeAt(model[off:min(off+piece, len(model))], uint64(off), false); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	c.disconnect()
	s.stop()
	return a, model
}

// readCompare reads [off, end) of the export through NBD in pieces of n bytes and compares
// every byte with model.
func readCompare(t *testing.T, s *server, model []byte, off, end, n int) {
	t.Helper()
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.disconnect()
	for ; off < end; off += n {
		k := min(n, end-off)
		got, err := c.readAt(uint64(off), uint32(k))
		if err != nil {
			t.Fatalf("read of %d bytes at %d: %v", k, off, err)
		}
		if !bytes.Equal(got, model[off:off+k]) {
			for i := range got {
				if got[i] != model[off+i] {
					t.Fatalf("read of %d bytes at %d: byte %d is %#x, want %#x (member 1 was cut at %d)",
						k, off, off+i, got[i], model[off+i], shrinkCut)
				}
			}
		}
	}
}

// TestShrunkMemberServe: member 1's file is truncated under raid5d serve. Every byte read back
// through NBD — in 1 MiB reads (served from the members' mappings where resident) and in 4 KiB
// reads around the cut (copies from the mappings) — is what was written; the member's short
// reads count as read errors and, past --read-error-limit, it is marked faulty.
func TestShrunkMemberServe(t *testing.T) {
	needRaid5d(t)
	a, model := filledArray(t)
	s := a.serve(t, "--read-error-limit", "3")
	if err := os.Truncate(a.members[1], shrinkCut); err != nil {
		t.Fatal(err)
	}
	copyCompare(t, s.uri, model)
	// The array offset of the stripe the cut is in, less one stripe: 4 KiB reads from there.
	at := int((shrinkCut-dataOffset)/chunkSize-1) * stripeData
	readCompare(t, s, model, at, at+4*stripeData, 4<<10)
	readCompare(t, s, model, 0, len(model), 1<<20)

	st := s.status()
	state, _, readErrors := st.member(a.members[1])
	if state != "faulty" || readErrors == 0 || st.State != "degraded" {
		t.Fatalf("after reads of the truncated member's lost range: member %q with %d read errors, array %q; want faulty, degraded",
			state, readErrors, st.State)
	}
	readCompare(t, s, model, 0, len(model), 1<<20) // degraded
}

// TestShrunkMemberScrub: a scrub repair over a member truncated under raid5d serve (kept
// active by a high read-error limit) stops at its short reads and rewrites nothing from
// zeroes: the other members' data areas are unchanged, and the array still reads back what
// was written.
func TestShrunkMemberScrub(t *testing.T) {
	needRaid5d(t)
	a, model := filledArray(t)
	dataSum := func(path string) [32]byte {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(b[dataOffset:]) // the superblocks change (events, dirty)
	}
	var before [memberCount][32]byte
	for i, m := range a.members {
		before[i] = dataSum(m)
	}
	s := a.serve(t, "--read-error-limit", "1000000000", "--sync-speed-min", "100M", "--sync-speed-max", "1G")
	if err := os.Truncate(a.members[1], shrinkCut); err != nil {
		t.Fatal(err)
	}
	out, code := s.manage("scrub", "repair", "--wait")
	if code == 0 {
		t.Errorf("scrub repair over a truncated member succeeded:\n%s", out)
	}
	t.Logf("scrub repair: exit %d\n%s", code, out)
	for i, m := range a.members {
		if i != 1 && dataSum(m) != before[i] {
			t.Errorf("member %d's data area changed during a scrub repair over truncated member 1", i)
		}
	}
	readCompare(t, s, model, 0, len(model), 1<<20)
	if state, _, readErrors := s.status().member(a.members[1]); state != "active" || readErrors == 0 {
		t.Errorf("truncated member under a high read-error limit: %q with %d read errors; want active, errors counted", state, readErrors)
	}
}
