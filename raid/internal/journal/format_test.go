package journal

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// dataOffset is a member data offset like the array's, for records that look real.
const dataOffset = 1 << 20

// encode encodes and seals a record as the write path does (commit: its group's commit
// point, at most seq).
func encode(uuid UUID, s0, n int64, ops []Op, seq, lsn, commit uint64) []byte {
	b := encodeRecord(nil, uuid, s0, n, ops)
	SealRecord(b, seq, lsn, commit)
	return b
}

// decode decodes a whole record (both checksums checked), as the replay does, into the ops
// it was encoded from (Buf pointing into b).
func decode(b []byte) (r *Record, ops []Op, err error) {
	r, err = DecodeRecord(b)
	if err != nil {
		return nil, nil, err
	}
	ops = r.Ops(b)
	return r, ops, nil
}

// TestRecordRoundTrip: a record decodes to what was encoded (writes of any length, trims
// without payload), and changing any byte it covers — fixed header, descriptors, payload,
// padding — makes it invalid.
func TestRecordRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	uuid := UUID{1, 2, 3}
	ops := []Op{
		{Role: 0, Off: dataOffset + 8192, Buf: make([]byte, 4096)},
		{Role: 2, Off: dataOffset + 512, Buf: make([]byte, 512)},
		{Role: 1, Off: dataOffset, Trim: 1 << 20},
		{Role: 31, Off: dataOffset + 3<<20, Buf: make([]byte, 12345)},
	}
	for _, op := range ops {
		for i := range op.Buf {
			op.Buf[i] = byte(rng.Uint32())
		}
	}
	rec := encode(uuid, 7, 3, ops, 42, 1<<30, 40)
	if want := 4096 + 20480; len(rec) != want { // a header block, then 4096+512+12345 payload bytes in whole pages
		t.Fatalf("record of %d bytes, want %d", len(rec), want)
	}
	r, got, err := decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if r.uuid != uuid || r.seq != 42 || r.lsn != 1<<30 || r.commit != 40 || r.s0 != 7 || r.n != 3 || len(got) != len(ops) {
		t.Fatalf("decoded %v seq %d lsn %d commit %d stripes %d+%d, %d ops", r.uuid, r.seq, r.lsn, r.commit, r.s0, r.n, len(got))
	}
	for i := range ops {
		if got[i].Role != ops[i].Role || got[i].Off != ops[i].Off || got[i].Trim != ops[i].Trim || !bytes.Equal(got[i].Buf, ops[i].Buf) {
			t.Fatalf("op %d: %+v, want %+v", i, got[i], ops[i])
		}
	}
	// Every byte matters: header, descriptors, their padding, payload, payload padding.
	for _, at := range []int{0, 9, 16, 24, 40, 60, 72, 79, 80, 84, 87, 88, 100, 4000, 4096, 8191, 8192 + 600, len(rec) - 1} {
		bad := bytes.Clone(rec)
		bad[at] ^= 0x10
		if _, err := DecodeRecord(bad); err == nil {
			t.Errorf("byte %d changed: the record still decodes", at)
		}
	}
	// Truncated: invalid, no panic.
	for _, n := range []int{0, 100, 4096, len(rec) - 4096} {
		if _, err := DecodeRecord(rec[:n]); err == nil {
			t.Errorf("truncated to %d bytes: decodes", n)
		}
	}
}

// FuzzJournalRecord: the record decoder never panics, and whatever it accepts re-encodes to
// the same bytes (so nothing it accepts is ambiguous).
func FuzzJournalRecord(f *testing.F) {
	f.Add(encode(UUID{9}, 1, 1, []Op{
		{Role: 1, Off: dataOffset, Buf: bytes.Repeat([]byte{0xab}, 4096)},
		{Role: 2, Off: dataOffset, Trim: 8192}}, 5, 4096, 3))
	f.Add(encode(UUID{}, 0, 4, []Op{{Role: 0, Off: 0, Trim: 1}}, 0, 0, 0))
	f.Add([]byte("raid5dJR"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ops, err := decode(b)
		if err != nil {
			return
		}
		re := encode(r.uuid, r.s0, r.n, ops, r.seq, r.lsn, r.commit)
		if !bytes.Equal(re, b[:len(re)]) {
			t.Fatalf("accepted record does not re-encode to itself")
		}
	})
}
