package raid

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

func testSuperblock() *superblock {
	return &superblock{
		ArrayUUID: UUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, DeviceUUID: UUID{0xff, 0xfe},
		Level: level5, Layout: stripe.RightSymmetric, Chunk: 128 << 10, Members: 7, Role: 5,
		DataOffset: DataOffset, DataSize: 1000 * (128 << 10), Events: 1<<40 + 3, Dirty: true,
		Created: time.Unix(1700000000, 123), Updated: time.Unix(1800000000, 456),
	}
}

func encoded(sb *superblock) []byte {
	b := make([]byte, SuperblockSize)
	sb.encode(b)
	return b
}

// reseal recomputes the checksum of an edited superblock.
func reseal(b []byte) {
	binary.LittleEndian.PutUint32(b[crcOff:], crc32.Checksum(b[:crcOff], crc32.MakeTable(crc32.Castagnoli)))
}

// checkRefused checks that sb, encoded, changed by edit and resealed, does not decode:
// ErrBadSuperblock.
func checkRefused(t *testing.T, sb *superblock, edit func(b []byte)) {
	t.Helper()
	c := encoded(sb)
	edit(c)
	reseal(c)
	if _, err := decodeSuperblock(c); !errors.Is(err, ErrBadSuperblock) {
		t.Fatalf("decode: %v, want ErrBadSuperblock", err)
	}
}

func TestSuperblockRoundTrip(t *testing.T) {
	for _, dirty := range []bool{false, true} {
		want := testSuperblock()
		want.Dirty = dirty
		got, err := decodeSuperblock(encoded(want))
		if err != nil {
			t.Fatal(err)
		}
		if !got.Created.Equal(want.Created) || !got.Updated.Equal(want.Updated) {
			t.Fatalf("times: got %v %v, want %v %v", got.Created, got.Updated, want.Created, want.Updated)
		}
		got.Created, got.Updated = want.Created, want.Updated
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decode(encode(sb)) = %+v, want %+v", got, want)
		}
	}
}

// readdSuperblock is testSuperblock with a bitmap and a re-add of role 2 under way: resynced
// up to stripe 64 and in pieces 5 and 9 (16 stripes each), 125 units of 8 stripes.
func readdSuperblock() *superblock {
	sb := testSuperblock()
	sb.Features = featureBitmap | featureReAdd
	sb.BitmapOff, sb.BitmapRegion, sb.BitmapSize = BitmapOffset, 8, bitmapBytes(125)
	sb.States[2] = roleRebuilding
	sb.Recovery = 64 * sb.Chunk
	sb.ReAdd = &readdRecord{Unit: 8, Piece: 16, Stale: make([]byte, 16), Done: []int64{5, 9}}
	sb.ReAdd.Stale[0], sb.ReAdd.Stale[15] = 0x81, 0x10
	return sb
}

// TestSuperblockReAdd: a re-add's record survives the round trip, and a record that does not
// fit the array is refused.
func TestSuperblockReAdd(t *testing.T) {
	want := readdSuperblock()
	got, err := decodeSuperblock(encoded(want))
	if err != nil {
		t.Fatal(err)
	}
	got.Created, got.Updated = want.Created, want.Updated
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decode(encode(sb)) = %+v (record %+v), want %+v", got, got.ReAdd, want.ReAdd)
	}
	le := binary.LittleEndian
	for name, edit := range map[string]func(b []byte){
		"unit not a power of two":  func(b []byte) { le.PutUint64(b[sbReAddUnit:], 12) },
		"piece 0":                  func(b []byte) { le.PutUint64(b[sbReAddPiece:], 0) },
		"map of the wrong size":    func(b []byte) { le.PutUint32(b[sbReAddMap:], 15) },
		"too many pieces done":     func(b []byte) { le.PutUint32(b[sbReAddDone:], readdExtra+1) },
		"piece below the position": func(b []byte) { le.PutUint64(b[sbReAddList:], 3) },
		"piece past the end":       func(b []byte) { le.PutUint64(b[sbReAddList:], 63) },
		"piece listed twice":       func(b []byte) { le.PutUint64(b[sbReAddList+8:], 5) },
		"position off a piece":     func(b []byte) { le.PutUint64(b[sbRecovery:], uint64(65*want.Chunk)) },
		"no role rebuilding":       func(b []byte) { b[sbStates+2] = roleActive },
		"no bitmap": func(b []byte) {
			le.PutUint32(b[sbFeatures:], featureReAdd)
			clear(b[sbBitmapOff : sbBitmapOff+16])
			clear(b[sbBitmapReg : sbBitmapReg+8])
		},
	} {
		t.Run(name, func(t *testing.T) { checkRefused(t, readdSuperblock(), edit) })
	}
}

func TestSuperblockCorruption(t *testing.T) {
	le := binary.LittleEndian
	tests := []struct {
		name string
		edit func(b []byte)
		want error
	}{
		{"zeroes", func(b []byte) { clear(b) }, ErrBadMagic},
		{"magic", func(b []byte) { b[0] ^= 1; reseal(b) }, ErrBadMagic},
		{"bit flip in UUID", func(b []byte) { b[sbArrayUUID+3] ^= 0x10 }, ErrChecksum},
		{"bit flip in reserved", func(b []byte) { b[2000] ^= 0x80 }, ErrChecksum},
		{"bit flip in checksum", func(b []byte) { b[crcOff] ^= 1 }, ErrChecksum},
		{"version 2", func(b []byte) { le.PutUint32(b[sbVersion:], 2); reseal(b) }, ErrVersion},
		{"level 6", func(b []byte) { le.PutUint32(b[sbLevel:], 6); reseal(b) }, ErrBadSuperblock},
		{"layout 9", func(b []byte) { le.PutUint32(b[sbLayout:], 9); reseal(b) }, ErrBadSuperblock},
		{"chunk 3000", func(b []byte) { le.PutUint64(b[sbChunk:], 3000); reseal(b) }, ErrBadSuperblock},
		{"role ≥ members", func(b []byte) { le.PutUint32(b[sbRole:], 7); reseal(b) }, ErrBadSuperblock},
		{"2 members", func(b []byte) { le.PutUint32(b[sbMembers:], 2); le.PutUint32(b[sbRole:], 1); reseal(b) }, ErrBadSuperblock},
		{"data size not chunks", func(b []byte) { le.PutUint64(b[sbDataSize:], 12345); reseal(b) }, ErrBadSuperblock},
		{"data offset in superblock", func(b []byte) { le.PutUint64(b[sbDataOffset:], 4096); reseal(b) }, ErrBadSuperblock},
		{"state 7", func(b []byte) { le.PutUint32(b[sbState:], 7); reseal(b) }, ErrBadSuperblock},
		{"unknown feature", func(b []byte) { le.PutUint32(b[sbFeatures:], 1); reseal(b) }, ErrBadSuperblock},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := encoded(testSuperblock())
			tt.edit(b)
			_, err := decodeSuperblock(b)
			if !errors.Is(err, tt.want) || !errors.Is(err, ErrBadSuperblock) {
				t.Fatalf("decode: %v, want %v (and ErrBadSuperblock)", err, tt.want)
			}
		})
	}
	if _, err := decodeSuperblock(make([]byte, 100)); !errors.Is(err, ErrBadSuperblock) {
		t.Fatalf("short buffer: %v", err)
	}
}

// FuzzDecodeSuperblock checks that decoding never panics, and that whatever decodes encodes
// and decodes again to an equal superblock.
func FuzzDecodeSuperblock(f *testing.F) {
	f.Add(encoded(testSuperblock()))
	clean := testSuperblock()
	clean.Dirty = false
	f.Add(encoded(clean))
	f.Add(make([]byte, SuperblockSize))
	resumed := testSuperblock()
	resumed.Resync = 10 * resumed.Chunk
	f.Add(encoded(resumed))
	f.Add(encoded(readdSuperblock()))
	f.Fuzz(func(t *testing.T, b []byte) {
		sb, err := decodeSuperblock(b)
		if err != nil {
			if !errors.Is(err, ErrBadSuperblock) {
				t.Fatalf("error %v does not match ErrBadSuperblock", err)
			}
			return
		}
		again := make([]byte, SuperblockSize)
		sb.encode(again)
		sb2, err := decodeSuperblock(again)
		if err != nil || !reflect.DeepEqual(sb, sb2) {
			t.Fatalf("re-encoded superblock decodes to %+v, %v; want %+v", sb2, err, sb)
		}
	})
}

func TestUUIDString(t *testing.T) {
	u := UUID{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
	if got, want := u.String(), "01234567-89ab-cdef-0123-456789abcdef"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}

func TestUUIDAndStateMarshalText(t *testing.T) {
	u := UUID{0x84, 0x0a, 0x45, 0x86, 0x77, 0x4b, 0x85, 0x95, 0x95, 0x6b, 0xf5, 0x25, 0xef, 0xce, 0x37, 0x7a}
	b, err := json.Marshal(map[string]any{"uuid": u, "state": StateDegraded})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"state":"degraded","uuid":"840a4586-774b-8595-956b-f525efce377a"}`; string(b) != want {
		t.Fatalf("json = %s, want %s", b, want)
	}
}

// TestSuperblockBitmap: the bitmap fields round-trip with the feature flag and are checked
// against the geometry; set without the flag, or with an unknown flag, they are refused.
func TestSuperblockBitmap(t *testing.T) {
	withBitmap := func() *superblock {
		sb := testSuperblock()
		sb.Features, sb.BitmapOff, sb.BitmapRegion = featureBitmap, BitmapOffset, 4
		sb.BitmapSize = bitmapBytes((sb.DataSize/sb.Chunk + 3) / 4)
		return sb
	}
	want := withBitmap()
	got, err := decodeSuperblock(encoded(want))
	if err != nil {
		t.Fatal(err)
	}
	if got.Features != featureBitmap || got.BitmapOff != BitmapOffset || got.BitmapSize != 4096 || got.BitmapRegion != 4 {
		t.Fatalf("bitmap fields %+v", got)
	}
	for _, tc := range []struct {
		name string
		edit func(sb *superblock)
	}{
		{"region not a power of two", func(sb *superblock) { sb.BitmapRegion = 3 }},
		{"region zero", func(sb *superblock) { sb.BitmapRegion = 0 }},
		{"wrong size", func(sb *superblock) { sb.BitmapSize = 8192 }},
		{"wrong offset", func(sb *superblock) { sb.BitmapOff = DataOffset }},
		{"fields without the flag", func(sb *superblock) { sb.Features = 0 }},
		{"unknown feature", func(sb *superblock) { sb.Features |= 1 << 7 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := withBitmap()
			tc.edit(sb)
			if _, err := decodeSuperblock(encoded(sb)); !errors.Is(err, ErrBadSuperblock) {
				t.Fatalf("decode: %v, want ErrBadSuperblock", err)
			}
		})
	}
	// The default region: the smallest power of two of stripes giving at most
	// DefaultBitmapBits bits and covering at least DefaultBitmapMinRegion bytes.
	const stripe = 3 << 16
	for _, stripes := range []int64{1, 100, 4096, 4097, 1 << 20, 1 << 24} {
		r := bitmapRegionStripes(stripes, stripe, 0)
		fits := func(r int64) bool { return (stripes+r-1)/r <= DefaultBitmapBits && r*stripe >= DefaultBitmapMinRegion }
		if r&(r-1) != 0 || !fits(r) || r > 1 && fits(r/2) {
			t.Fatalf("%d stripes: region %d stripes", stripes, r)
		}
	}
	if r := bitmapRegionStripes(1000, 3<<16, 5*3<<16); r != 8 {
		t.Fatalf("5 stripes' worth rounds to %d stripes, want 8", r)
	}
}

// TestSuperblockJournal: the journal feature and path round-trip; a path without the feature,
// or longer than the room for it, is refused; superblocks without a journal read as before.
func TestSuperblockJournal(t *testing.T) {
	want := testSuperblock()
	want.Features, want.JournalPath = featureJournal, "/var/lib/raid5d/journal.img"
	b := encoded(want)
	got, err := decodeSuperblock(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Features != featureJournal || got.JournalPath != want.JournalPath {
		t.Fatalf("journal fields: features %#x, path %q", got.Features, got.JournalPath)
	}
	if got, err := decodeSuperblock(encoded(testSuperblock())); err != nil || got.JournalPath != "" || got.Features != 0 {
		t.Fatalf("without a journal: %+v, %v", got, err)
	}
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		edit func(b []byte)
	}{
		{"path without the feature", func(b []byte) { le.PutUint32(b[sbFeatures:], 0) }},
		{"path too long", func(b []byte) { le.PutUint32(b[sbJournalLen:], MaxJournalPath+1) }},
	} {
		t.Run(tc.name, func(t *testing.T) { checkRefused(t, want, tc.edit) })
	}
}

// TestSuperblockResync: the full resync's resume point round-trips; a superblock from before
// the field (zeroes there) has none; a point that is not a chunk multiple inside the data
// area, or on a clean superblock, or with a bitmap or journal (their own checkpoints), is
// refused; and the field is covered by the checksum.
func TestSuperblockResync(t *testing.T) {
	want := testSuperblock()
	want.Resync = 300 * want.Chunk
	b := encoded(want)
	if got, err := decodeSuperblock(b); err != nil || got.Resync != want.Resync {
		t.Fatalf("decode: resync %v, %v; want %d", got, err, want.Resync)
	}
	old := encoded(testSuperblock())
	for i, c := range old[sbJournalEnd:crcOff] {
		if c != 0 {
			t.Fatalf("byte %d after the journal path is %#x in a superblock without a resume point, want 0", sbJournalEnd+i, c)
		}
	}
	if got, err := decodeSuperblock(old); err != nil || got.Resync != 0 {
		t.Fatalf("superblock without the field: resync %v, %v; want 0", got, err)
	}
	full := testSuperblock()
	full.Resync = full.DataSize
	if got, err := decodeSuperblock(encoded(full)); err != nil || got.Resync != full.DataSize {
		t.Fatalf("resume point at the end: %v, %v", got, err)
	}
	bit := make([]byte, SuperblockSize)
	copy(bit, b)
	bit[sbResync+1] ^= 1
	if _, err := decodeSuperblock(bit); !errors.Is(err, ErrChecksum) {
		t.Fatalf("bit flip in the resume point: %v, want ErrChecksum", err)
	}
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		edit func(b []byte)
	}{
		{"not a chunk multiple", func(b []byte) { le.PutUint64(b[sbResync:], uint64(want.Resync+512)) }},
		{"past the data", func(b []byte) { le.PutUint64(b[sbResync:], uint64(want.DataSize+want.Chunk)) }},
		{"negative", func(b []byte) { le.PutUint64(b[sbResync:], uint64(-want.Chunk)) }},
		{"clean", func(b []byte) { le.PutUint32(b[sbState:], stateClean) }},
		{"journal", func(b []byte) { le.PutUint32(b[sbFeatures:], featureJournal) }},
	} {
		t.Run(tc.name, func(t *testing.T) { checkRefused(t, want, tc.edit) })
	}
	bm := testSuperblock()
	bm.Features, bm.BitmapOff, bm.BitmapRegion = featureBitmap, BitmapOffset, 1
	bm.BitmapSize = bitmapBytes(bm.DataSize / bm.Chunk)
	if _, err := decodeSuperblock(encoded(bm)); err != nil {
		t.Fatalf("bitmap superblock: %v", err)
	}
	bm.Resync = bm.Chunk
	if _, err := decodeSuperblock(encoded(bm)); !errors.Is(err, ErrBadSuperblock) {
		t.Fatalf("resume point with a bitmap: %v, want ErrBadSuperblock", err)
	}
}
