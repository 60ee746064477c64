package raid_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// corruptJournalArray makes a journaled array (4 members, cache off) and writes, one record
// each and one group each: block X (stripe 2) generation 1, block Y (stripe 9) generation 1,
// X generation 2, block Z (stripe 20) generation 1; then flushes (the members are synced)
// and the power goes. The records are at ring positions 0, 12K, 24K and 36K (header page,
// data, parity). It returns the members, the journal, each member's stable bytes as flushed,
// and the blocks' offsets and flushed generations.
func corruptJournalArray(t *testing.T, prefix string) (vs []*raidtest.Volatile, jv *raidtest.Volatile, flushed [][]byte, blocks map[int64]int64) {
	t.Helper()
	a, vs, jv := journaled(t, prefix, 4, raid.DataOffset+64*4096, raid.MinJournalSize, raid.IOOptions{StripeCache: -1})
	ss := a.Layout().StripeSize()
	X, Y, Z := 2*ss, 9*ss, 20*ss
	buf := make([]byte, blk)
	for _, w := range []struct {
		off int64
		gen uint64
	}{{X, 1}, {Y, 1}, {X, 2}, {Z, 1}} {
		makeBlock(buf, w.off, w.gen)
		if _, err := a.WriteAt(buf, w.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	_, _, _, ring, _ := raid.JournalPosition(a)
	for i, lsn := range []uint64{0, 12 << 10, 24 << 10, 36 << 10} {
		if seq, err := recordAt(jv, ring, lsn); err != nil || seq != uint64(i+1) {
			t.Fatalf("record %d: seq %d, %v", i, seq, err)
		}
	}
	raidtest.PowerCut(0, nil, append(vs, jv)...) // nothing is lost: everything was synced
	a.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	flushed = stableBytes(append(vs, jv))
	return vs, jv, flushed, map[int64]int64{X: 2, Y: 1, Z: 1}
}

func stableBytes(vs []*raidtest.Volatile) [][]byte {
	out := make([][]byte, len(vs))
	for i, v := range vs {
		out[i] = make([]byte, v.Size())
		v.Stable(out[i], 0)
	}
	return out
}

// flipJournal flips one bit of the journal's stable byte at ring position off.
func flipJournal(jv *raidtest.Volatile, off int64) {
	b := []byte{0}
	jv.ReadAt(b, raid.JournalRingOffset+off)
	b[0] ^= 0x20
	jv.WriteAt(b, raid.JournalRingOffset+off)
	jv.Sync()
}

// TestJournalCorruptNoRollback: after a crash, one flipped byte in a record in the middle of
// the journal — in its payload, or in its header so that its length is unknown — must not
// roll back the flushed writes of the records after it. The second record (block Y) is
// damaged; the third rewrote block X, which the first wrote before: replaying the first and
// stopping at the damage would put X's older generation back. Assembly must refuse with
// ErrJournalCorrupt, naming the position and the sequence numbers, and write nothing: every
// byte of every member, and of the journal, is as flushed.
func TestJournalCorruptNoRollback(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  int64 // ring position of the flipped byte
	}{
		{"payload", 12<<10 + 4096 + 100},
		{"header", 12<<10 + 20}, // the sequence number: header checksum wrong, length unknown
		{"descriptor", 12<<10 + 88 + 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, jv, flushed, _ := corruptJournalArray(t, "c"+tc.name[:1])
			flipJournal(jv, tc.off)
			flushed[len(vs)] = stableBytes([]*raidtest.Volatile{jv})[0]
			c, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, IOOptions: raid.IOOptions{StripeCache: -1}})
			if c != nil {
				c.Close()
			}
			after := stableBytes(append(vs, jv))
			for i := range vs {
				if d := firstDiff(after[i][raid.DataOffset:], flushed[i][raid.DataOffset:]); d < len(after[i])-raid.DataOffset {
					t.Fatalf("member %d changed at data byte %d: a replay went back in time", i, d)
				}
			}
			for i, b := range after {
				if !bytes.Equal(b, flushed[i]) {
					t.Fatalf("device %d (%d members, then the journal) changed at byte %d", i, len(vs), firstDiff(b, flushed[i]))
				}
			}
			if !errors.Is(err, raid.ErrJournalCorrupt) {
				t.Fatalf("Assemble: %v; want ErrJournalCorrupt", err)
			}
			for _, say := range []string{"position 12288 (sequence 2)", "position 24576 (sequence 3)", "SkipCorruptJournal"} {
				if !bytes.Contains([]byte(err.Error()), []byte(say)) {
					t.Errorf("the error does not say %q: %v", say, err)
				}
			}
			t.Log(err)
		})
	}
}

// TestJournalSkipCorrupt: SkipCorruptJournal assembles the array of
// TestJournalCorruptNoRollback: nothing is replayed, the journal is discarded and all parity
// recomputed (a full resync); every block holds its flushed generation, every stripe's parity
// matches, and the log says what was trusted. A crash before the resync ends leaves the
// resync owed: the next assembly, with a journal that is not corrupt, resyncs again; once a
// resync has finished the flag goes and a clean stop is clean.
func TestJournalSkipCorrupt(t *testing.T) {
	vs, jv, _, blocks := corruptJournalArray(t, "s")
	flipJournal(jv, 12<<10+4096+100)
	check := func(a *raid.Array) {
		t.Helper()
		size := mustSize(a)
		got := make([]byte, size)
		if _, err := a.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		for off := int64(0); off < size; off += blk {
			if g := blockGen(got[off:off+blk], off); g != blocks[off] {
				t.Fatalf("block at %d holds generation %d, flushed %d", off, g, blocks[off])
			}
		}
	}
	// First a resync too slow to finish: the power goes during it.
	var logs recorder
	slow := raid.IOOptions{StripeCache: -1, SyncSpeedMin: 4096, SyncSpeedMax: 4096}
	a, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, SkipCorruptJournal: true,
		Logger: slog.New(&logs), IOOptions: slow})
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Status(); !st.Unclean || st.Journal.Replayed != 0 || !raid.JournalNeedsResync(a) || logs.count(slog.LevelError) == 0 {
		t.Fatalf("forced: unclean %v, journal %+v, flag %v, %d errors logged; want a resync owed, nothing replayed, said loudly",
			st.Unclean, st.Journal, raid.JournalNeedsResync(a), logs.count(slog.LevelError))
	}
	check(a)
	buf := make([]byte, blk)
	makeBlock(buf, 0, 7) // a write meanwhile is journaled as usual
	if _, err := a.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	blocks[0] = 7
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	raidtest.PowerCut(0, nil, append(vs, jv)...)
	a.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	b, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, IOOptions: fastSync})
	if err != nil {
		t.Fatal(err)
	}
	if st := b.Status(); st.Journal.Replayed != 1 || !st.Unclean && st.LastResync == nil {
		t.Fatalf("after a crash during the forced resync: journal %+v, unclean %v; want the write replayed and the resync again",
			st.Journal, st.Unclean)
	}
	deadline := time.Now().Add(30 * time.Second)
	for b.Status().Unclean {
		if time.Now().After(deadline) {
			t.Fatalf("the resync did not end: %+v", b.Status().Sync)
		}
		time.Sleep(5 * time.Millisecond)
	}
	check(b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	if bad := inconsistent(t, asMembers(vs), b.Layout()); len(bad) != 0 {
		t.Fatalf("inconsistent stripes after the resync: %v", bad)
	}
	c, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st := c.Status(); st.Unclean || st.Dirty || raid.JournalNeedsResync(c) {
		t.Fatalf("after the resync and a clean stop: unclean %v, dirty %v, flag %v", st.Unclean, st.Dirty, raid.JournalNeedsResync(c))
	}
	check(c)
}

// TestJournalTornGroup: the normal crash case still ends the replay quietly. The group
// being written at the crash is torn — its first record lost, a later record of the same
// group whole (its commit point is the torn record's number): the replay stops at the torn
// record without an error, replays what is before it, and not the whole record after it
// (its member writes were never issued). The same damage with the later record from a later
// group (its commit point above) is corruption.
func TestJournalTornGroup(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sameGroup bool
	}{{"same group", true}, {"later group", false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, vs, jv := journaled(t, fmt.Sprintf("g%v", tc.sameGroup), 3, raid.DataOffset+64*4096, raid.MinJournalSize,
				raid.IOOptions{StripeCache: -1})
			ss := a.Layout().StripeSize()
			blocks := []int64{2 * ss, 9 * ss, 20 * ss} // three stripes: three records, three groups
			buf := make([]byte, blk)
			for i, off := range blocks {
				makeBlock(buf, off, uint64(i+1))
				if _, err := a.WriteAt(buf, off); err != nil {
					t.Fatal(err)
				}
			}
			raidtest.PowerCut(0, nil, append(vs, jv)...) // the members' writes are lost
			a.Close()
			for _, v := range append(vs, jv) {
				v.Reopen()
			}
			// The records are at 0, 12K and 24K. Make the third one of the second's group.
			if tc.sameGroup {
				rec := make([]byte, 12<<10)
				jv.Stable(rec, raid.JournalRingOffset+24<<10)
				raid.ResealJournalRecord(rec, 3, 24<<10, 2)
				jv.WriteAt(rec, raid.JournalRingOffset+24<<10)
				jv.Sync()
			}
			flipJournal(jv, 12<<10+4096+100)
			c, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, IOOptions: raid.IOOptions{StripeCache: -1}})
			if !tc.sameGroup {
				if c != nil {
					c.Close()
				}
				if !errors.Is(err, raid.ErrJournalCorrupt) {
					t.Fatalf("Assemble: %v; want ErrJournalCorrupt", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if st := c.Status(); st.Journal == nil || st.Journal.Replayed != 1 || st.Unclean || st.Sync != nil {
				t.Fatalf("after the replay: %+v, unclean %v, sync %+v", st.Journal, st.Unclean, st.Sync)
			}
			for i, off := range blocks {
				if _, err := c.ReadAt(buf, off); err != nil {
					t.Fatal(err)
				}
				want := int64(0)
				if i == 0 {
					want = 1
				}
				if g := blockGen(buf, off); g != want {
					t.Fatalf("write %d: generation %d after the replay, want %d", i, g, want)
				}
			}
		})
	}
}

// TestJournalOldFormat: a journal of format 1 (an older raid5d: records without a commit
// point) is used as it is when there is nothing to replay, and its header is in the current
// format after the first checkpoint; one with a record to replay is refused with ErrJournal,
// saying so, before anything is written — never treated as empty — and SkipCorruptJournal
// discards it and resyncs.
func TestJournalOldFormat(t *testing.T) {
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	le := binary.LittleEndian
	toV1Header := func(jv *raidtest.Volatile) {
		for slot := int64(0); slot < 2; slot++ {
			h := make([]byte, 4096)
			jv.Stable(h, slot*4096)
			if string(h[:8]) != "raid5dJH" {
				continue
			}
			le.PutUint32(h[8:], 1)
			le.PutUint32(h[88:], 0)
			le.PutUint32(h[4092:], crc32.Checksum(h[:4092], castagnoli))
			jv.WriteAt(h, slot*4096)
		}
		jv.Sync()
	}
	headerVersion := func(jv *raidtest.Volatile) (v []uint32) {
		h := make([]byte, 8192)
		jv.Stable(h, 0)
		return []uint32{le.Uint32(h[8:]), le.Uint32(h[4096+8:])}
	}
	// Clean: assembled, written, closed: the header is version 2 again.
	a, vs, jv := journaled(t, "o", 3, raid.DataOffset+64*4096, raid.MinJournalSize, raid.IOOptions{StripeCache: -1})
	a.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	toV1Header(jv)
	b, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatalf("a clean array with a journal of format 1: %v", err)
	}
	buf := make([]byte, blk)
	makeBlock(buf, 0, 1)
	if _, err := b.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	if v := headerVersion(jv); v[0] != 2 && v[1] != 2 {
		t.Fatalf("header versions %v after a checkpoint; want one slot of version 2", v)
	}

	// Dirty, with a record of format 1 at the tail.
	c, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	_, tail, _, ring, _ := raid.JournalPosition(c)
	makeBlock(buf, 0, 2)
	if _, err := c.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	raidtest.PowerCut(0, nil, append(vs, jv)...)
	c.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	toV1Header(jv)
	off := raid.JournalRingOffset + int64(tail%uint64(ring))
	rec := make([]byte, 4096)
	jv.Stable(rec, off)
	le.PutUint32(rec[8:], 1) // version 1's type: ops
	le.PutUint32(rec[76:], crc32.Checksum(rec[:76], castagnoli))
	jv.WriteAt(rec, off)
	jv.Sync()
	before := stableBytes(append(vs, jv))
	d, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv})
	if d != nil {
		d.Close()
	}
	if !errors.Is(err, raid.ErrJournal) || !bytes.Contains([]byte(err.Error()), []byte("format 1")) {
		t.Fatalf("Assemble with a record of format 1 to replay: %v; want ErrJournal saying so", err)
	}
	for i, b := range stableBytes(append(vs, jv)) {
		if !bytes.Equal(b, before[i]) {
			t.Fatalf("the refused assembly wrote to device %d", i)
		}
	}
	e, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv, SkipCorruptJournal: true, IOOptions: fastSync})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if st := e.Status(); !st.Unclean && st.LastResync == nil {
		t.Fatalf("SkipCorruptJournal: unclean %v, last resync %+v; want a full resync", st.Unclean, st.LastResync)
	}
}
