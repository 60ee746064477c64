package test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// journalRecords returns the logical positions of the valid-looking records in the journal
// file (a page starting with the record magic whose position field names its own place in
// the ring), by sequence number.
func journalRecords(t *testing.T, journal string) (ring int64, bySeq map[uint64]int64) {
	t.Helper()
	b, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	const ringOff, page = 8192, 4096
	ring = int64(len(b)-ringOff) / page * page
	bySeq = map[uint64]int64{}
	for off := int64(0); off < ring; off += page {
		pg := b[ringOff+off : ringOff+off+page]
		if string(pg[:8]) != "raid5dJR" {
			continue
		}
		seq, lsn := binary.LittleEndian.Uint64(pg[16:]), int64(binary.LittleEndian.Uint64(pg[24:]))
		if lsn%ring == off {
			bySeq[seq] = lsn
		}
	}
	return ring, bySeq
}

func fileSums(t *testing.T, paths ...string) [][32]byte {
	t.Helper()
	var out [][32]byte
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			t.Fatal(err)
		}
		f.Close()
		out = append(out, [32]byte(h.Sum(nil)))
	}
	return out
}

// TestJournalCorruptServe: one flipped byte in a record in the middle of the write journal,
// after a SIGKILL, must not roll flushed writes back. A journaled array (stripe cache off:
// one record per write) gets block X, block Y, X again and block Z, flushed; the daemon is
// killed; a byte of Y's record (the second) is flipped. The next `raid5d serve` exits non-zero
// with "raid: write journal corrupt", naming the record, and never serves or writes: every
// byte of every member and of the journal is unchanged. `serve --skip-corrupt-journal` then
// serves it: the log says what it trusts, a full resync runs, every block reads what was
// flushed (X its second version), a scrub check finds no mismatch, and a clean stop leaves an
// array that serves without the flag.
func TestJournalCorruptServe(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("raid5d's journal")
	}
	journal := filepath.Join(t.TempDir(), "journal.img")
	a := newArrayWith(t, "--consistency", "journal", "--journal", journal, "--journal-size", "4M")
	s := a.serve(t, "--stripe-cache", "off")
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	X, Y, Z := uint64(2*stripeData), uint64(9*stripeData), uint64(20*stripeData)
	block := func(tag byte) []byte { return bytes.Repeat([]byte{tag}, 4096) }
	for _, w := range []struct {
		off uint64
		tag byte
	}{{X, 0x11}, {Y, 0x21}, {X, 0x12}, {Z, 0x31}} {
		if err := c.writeAt(block(w.tag), w.off, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]byte{X: 0x12, Y: 0x21, Z: 0x31}
	_, recs := journalRecords(t, journal)
	seqs := make([]uint64, 0, len(recs))
	for seq := range recs {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	if len(seqs) < 4 {
		t.Fatalf("the journal holds %d records (%v), want the 4 writes'", len(seqs), recs)
	}
	s.crash()
	c.Close()

	// Flip a byte in the payload of the second of the last four records (Y's).
	ring, _ := journalRecords(t, journal)
	at := 8192 + recs[seqs[len(seqs)-3]]%ring + 4096 + 100
	f, err := os.OpenFile(journal, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x04
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
	f.Close()
	files := append(slices.Clone(a.members), journal)
	before := fileSums(t, files...)

	sockDir, err := os.MkdirTemp("", "r5d")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	sock := filepath.Join(sockDir, "nbd.sock")
	refused := startProc(t, raid5dBin, append([]string{"serve", "--socket", sock, "--control", filepath.Join(sockDir, "control.sock")}, a.members...)...)
	deadline := time.Now().Add(startTimeout)
	for refused.running() {
		if c, err := wireDial(sock); err == nil {
			c.abort()
			refused.stop(syscall.SIGKILL, stopGrace)
			t.Fatal("raid5d serve serves an array whose journal is corrupt")
		}
		if time.Now().After(deadline) {
			refused.stop(syscall.SIGKILL, stopGrace)
			t.Fatalf("raid5d serve on a corrupt journal still runs after %v", startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	out := refused.out.String()
	if refused.err == nil || !strings.Contains(out, "raid: write journal corrupt") || !strings.Contains(out, "--skip-corrupt-journal") {
		t.Fatalf("raid5d serve on a corrupt journal: %v; want a non-zero exit saying the journal is corrupt and what to do\n%s", refused.err, out)
	}
	t.Logf("serve: %v: %s", refused.err, strings.TrimSpace(out))
	for i, sum := range fileSums(t, files...) {
		if sum != before[i] {
			t.Fatalf("the refused serve changed %s", files[i])
		}
	}

	// The way forward.
	s = a.serve(t, "--skip-corrupt-journal", "--sync-speed-min", crashSyncSpeed)
	waitFor(t, "the resync after --skip-corrupt-journal", 60*time.Second, s.proc, func() bool {
		st := s.crashStatus()
		return st.LastResync != nil && !st.Unclean && (st.Sync == nil || st.Sync.Kind != "resync")
	})
	if log := s.out.String(); !strings.Contains(log, "DISCARDING the write journal") || !strings.Contains(log, "trusted as they are") {
		t.Fatalf("serve --skip-corrupt-journal does not say what it trusts:\n%s", log)
	}
	c, err = wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	for off, tag := range want {
		got, err := c.readAt(off, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, block(tag)) {
			t.Fatalf("block at %d reads %#x..., flushed %#x", off, got[0], tag)
		}
	}
	c.disconnect()
	s.scrubClean()
	s.stop()
	s = a.serve(t)
	if st := s.crashStatus(); st.Unclean || st.Sync != nil || st.LastResync != nil {
		t.Fatalf("after the resync and a clean stop: %+v; want a clean array", st)
	}
}
