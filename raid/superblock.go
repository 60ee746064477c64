package raid

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// On-disk constants; doc.go's # Layout section has the full table.
const (
	SuperblockOffset = 4096    // member offset of the superblock
	SuperblockSize   = 4096    // bytes
	ReservedOffset   = 8 << 10 // start of the area reserved for a write-intent bitmap and a log
	DataOffset       = 1 << 20 // member offset of the data area
	MinDataChunks    = 4       // a member must hold at least this many chunks of data

	superblockVersion = 1
	level5            = 5
	crcOff            = SuperblockSize - 4
)

// superblockMagic opens every raid5d superblock.
var superblockMagic = [8]byte{'r', 'a', 'i', 'd', '5', 'd', 'S', 'B'}

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// UUID is a random 16-byte identifier (of an array or of a member device).
type UUID [16]byte

func newUUID() UUID {
	var u UUID
	rand.Read(u[:]) // never returns an error (crypto/rand, Go ≥ 1.24)
	return u
}

// MarshalText formats u as String does, so logs and JSON show the UUID, not 16 numbers.
func (u UUID) MarshalText() ([]byte, error) { return []byte(u.String()), nil }

// String formats u as 8-4-4-4-12 hex digits.
func (u UUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// superblock is the decoded form of the 4 KiB block at SuperblockOffset of every member.
type superblock struct {
	ArrayUUID  UUID
	DeviceUUID UUID
	Level      uint32
	Layout     stripe.Algorithm
	Chunk      int64
	Members    int
	Role       int
	DataOffset int64
	DataSize   int64 // bytes of data area used on each member, a multiple of Chunk
	Events     uint64
	Dirty      bool
	Features   uint32 // featureBitmap; 0 in superblocks from before the bitmap
	Created    time.Time
	Updated    time.Time
	BitmapOff  int64 // member offset of the write-intent bitmap (BitmapOffset), 0 = none
	BitmapSize int64 // its size in bytes (whole pages)
	// BitmapRegion is the stripes each bit covers (a power of two), 0 without a bitmap.
	BitmapRegion int64
	LogOff       int64 // reserved: member offset of the log, 0 = none
	LogSize      int64
	// Recovery is how many bytes of the data area the member rebuilding into the role whose
	// state is roleRebuilding has rebuilt (a checkpoint; 0 when nothing is being rebuilt).
	Recovery int64
	// States is the array's per-role state table (roleActive, roleFaulty, roleRebuilding);
	// all zero (active) in superblocks written before it existed.
	States [stripe.MaxMembers]uint8
	// JournalPath is where the write journal is (featureJournal): the path Create was
	// given, made absolute, or the Member's name. "" without a journal.
	JournalPath string
	// Resync is how far a full resync (no bitmap, no journal) had got when the array was
	// stopped cleanly in the middle of it: bytes of the data area, a multiple of Chunk, below
	// which parity is consistent; the next assembly resumes the resync there. It is set only
	// on a dirty superblock, like md's resync_offset, which md records only while the array
	// is in sync: the state stays dirty, so a build from before this field resyncs
	// everything (slower, never wrong), and 0 (every superblock from before it) means no
	// resume point. Assembly clears it, durably, before the array takes a write: see
	// Array.resumePoint for why a crash must not resume.
	Resync int64
	// EventsCleared is the events counter of the last superblock update written while every
	// role had an active member (md's bitmap events_cleared): the write-intent bitmap clears
	// bits only then, so a member that left with an events counter at least this high missed
	// only writes whose regions are still set in the bitmap, and can be re-added by resyncing
	// those (Array.ReAdd). 0, as in every superblock from before it (an old build writes
	// zeroes there and clears bits while degraded), means unknown: no re-add.
	EventsCleared uint64
	// ReAdd is the record of a re-add's resync in progress (featureReAdd; readdmap.go): with
	// Recovery, where the member rebuilding into the role whose state is roleRebuilding is
	// whole. nil when the rebuilding member, if any, is rebuilt whole.
	ReAdd *readdRecord
}

// Per-role states in the superblock's table, and the role of a spare.
const (
	roleActive     = 0 // a working member holds the role
	roleFaulty     = 1 // no working member: it failed or is missing
	roleRebuilding = 2 // a spare is being rebuilt into the role (up to Recovery)

	spareRole = -1 // Role of an idle spare (encoded as 0xFFFFFFFF)
)

// Field offsets within the superblock; see doc.go # Layout.
const (
	sbMagic      = 0
	sbVersion    = 8
	sbArrayUUID  = 16
	sbDeviceUUID = 32
	sbLevel      = 48
	sbLayout     = 52
	sbChunk      = 56
	sbMembers    = 64
	sbRole       = 68
	sbDataOffset = 72
	sbDataSize   = 80
	sbEvents     = 88
	sbState      = 96
	sbFeatures   = 100
	sbCreated    = 104
	sbUpdated    = 112
	sbBitmapOff  = 120
	sbBitmapSize = 128
	sbLogOff     = 136
	sbLogSize    = 144
	sbRecovery   = 152
	sbStates     = 160 // stripe.MaxMembers bytes
	sbBitmapReg  = 192
	sbJournalLen = 200                        // uint32: length of the journal path
	sbJournal    = 204                        // the journal path, MaxJournalPath bytes at most
	sbJournalEnd = sbJournal + MaxJournalPath // [sbJournalEnd, sbResync) is written as zeroes
	sbResync     = 1232                       // int64: Resync, the full resync's resume point
	sbCleared    = sbResync + 8               // uint64: EventsCleared, the bitmap's cleared mark
	sbReAddUnit  = sbCleared + 8              // int64: readdRecord.Unit, 0 without featureReAdd
	sbReAddPiece = sbReAddUnit + 8            // int64: readdRecord.Piece
	sbReAddDone  = sbReAddPiece + 8           // uint32: how many pieces Done lists
	sbReAddMap   = sbReAddDone + 4            // uint32: the bytes of Stale
	sbReAddList  = sbReAddMap + 4             // readdExtra int64s: Done
	sbReAddStale = sbReAddList + 8*readdExtra // readdMapMax bytes at most: Stale
	sbEnd        = sbReAddStale + readdMapMax // [sbEnd, crcOff) is reserved and written as zeroes

	// featureBitmap: the member carries a write-intent bitmap (BitmapOff, BitmapSize,
	// BitmapRegion are set).
	featureBitmap = 1 << 0
	// featureJournal: the array's consistency policy is the write journal, on the device at
	// JournalPath. A build from before the journal refuses the array (unknown feature), as it
	// must: it would assemble it without replaying the journal.
	featureJournal = 1 << 1
	// featureReAdd: a re-added member is being resynced (ReAdd, the record of where it is
	// whole). A build from before it refuses the array, as it must: it would take the member
	// as whole above the rebuild position, or rebuild it from parity torn by a crash.
	featureReAdd  = 1 << 2
	knownFeatures = featureBitmap | featureJournal | featureReAdd

	stateClean = 0
	stateDirty = 1
)

// The resync field must not overlap the longest journal path (a negative constant does not
// convert to uint: the build fails).
const _ = uint(sbResync - sbJournalEnd)

// encode writes sb into b (SuperblockSize bytes), checksum included.
func (sb *superblock) encode(b []byte) {
	b = b[:SuperblockSize]
	clear(b)
	le := binary.LittleEndian
	copy(b[sbMagic:], superblockMagic[:])
	le.PutUint32(b[sbVersion:], superblockVersion)
	le.PutUint32(b[sbVersion+4:], SuperblockSize)
	copy(b[sbArrayUUID:], sb.ArrayUUID[:])
	copy(b[sbDeviceUUID:], sb.DeviceUUID[:])
	le.PutUint32(b[sbLevel:], sb.Level)
	le.PutUint32(b[sbLayout:], uint32(sb.Layout))
	le.PutUint64(b[sbChunk:], uint64(sb.Chunk))
	le.PutUint32(b[sbMembers:], uint32(sb.Members))
	le.PutUint32(b[sbRole:], uint32(sb.Role))
	le.PutUint64(b[sbDataOffset:], uint64(sb.DataOffset))
	le.PutUint64(b[sbDataSize:], uint64(sb.DataSize))
	le.PutUint64(b[sbEvents:], sb.Events)
	state := uint32(stateClean)
	if sb.Dirty {
		state = stateDirty
	}
	le.PutUint32(b[sbState:], state)
	le.PutUint32(b[sbFeatures:], sb.Features)
	le.PutUint64(b[sbCreated:], uint64(sb.Created.UnixNano()))
	le.PutUint64(b[sbUpdated:], uint64(sb.Updated.UnixNano()))
	le.PutUint64(b[sbBitmapOff:], uint64(sb.BitmapOff))
	le.PutUint64(b[sbBitmapSize:], uint64(sb.BitmapSize))
	le.PutUint64(b[sbLogOff:], uint64(sb.LogOff))
	le.PutUint64(b[sbLogSize:], uint64(sb.LogSize))
	le.PutUint64(b[sbRecovery:], uint64(sb.Recovery))
	copy(b[sbStates:sbBitmapReg], sb.States[:])
	le.PutUint64(b[sbBitmapReg:], uint64(sb.BitmapRegion))
	le.PutUint32(b[sbJournalLen:], uint32(copy(b[sbJournal:sbJournalEnd], sb.JournalPath)))
	le.PutUint64(b[sbResync:], uint64(sb.Resync))
	le.PutUint64(b[sbCleared:], sb.EventsCleared)
	if r := sb.ReAdd; r != nil {
		le.PutUint64(b[sbReAddUnit:], uint64(r.Unit))
		le.PutUint64(b[sbReAddPiece:], uint64(r.Piece))
		le.PutUint32(b[sbReAddDone:], uint32(len(r.Done)))
		le.PutUint32(b[sbReAddMap:], uint32(copy(b[sbReAddStale:sbEnd], r.Stale)))
		for i, p := range r.Done {
			le.PutUint64(b[sbReAddList+8*i:], uint64(p))
		}
	}
	le.PutUint32(b[crcOff:], crc32.Checksum(b[:crcOff], crc32c))
}

// decodeSuperblock parses and checks a superblock. It never panics: any input that is not a
// well-formed superblock returns an error matching ErrBadSuperblock.
func decodeSuperblock(b []byte) (*superblock, error) {
	if len(b) < SuperblockSize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrBadMagic, len(b), SuperblockSize)
	}
	b = b[:SuperblockSize]
	if [8]byte(b[sbMagic:sbMagic+8]) != superblockMagic {
		return nil, ErrBadMagic
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[crcOff:]), crc32.Checksum(b[:crcOff], crc32c); got != want {
		return nil, fmt.Errorf("%w: stored %#08x, computed %#08x", ErrChecksum, got, want)
	}
	if v := le.Uint32(b[sbVersion:]); v != superblockVersion {
		return nil, fmt.Errorf("%w: %d (this build reads %d)", ErrVersion, v, superblockVersion)
	}
	sb := &superblock{
		Level:      le.Uint32(b[sbLevel:]),
		Chunk:      int64(le.Uint64(b[sbChunk:])),
		DataOffset: int64(le.Uint64(b[sbDataOffset:])),
		DataSize:   int64(le.Uint64(b[sbDataSize:])),
		Events:     le.Uint64(b[sbEvents:]),
		Features:   le.Uint32(b[sbFeatures:]),
		Created:    time.Unix(0, int64(le.Uint64(b[sbCreated:]))),
		Updated:    time.Unix(0, int64(le.Uint64(b[sbUpdated:]))),
		BitmapOff:  int64(le.Uint64(b[sbBitmapOff:])),
		BitmapSize: int64(le.Uint64(b[sbBitmapSize:])),
		LogOff:     int64(le.Uint64(b[sbLogOff:])),
		LogSize:    int64(le.Uint64(b[sbLogSize:])),
		Recovery:   int64(le.Uint64(b[sbRecovery:])),
	}
	copy(sb.States[:], b[sbStates:sbBitmapReg])
	sb.BitmapRegion = int64(le.Uint64(b[sbBitmapReg:]))
	sb.Resync = int64(le.Uint64(b[sbResync:]))
	sb.EventsCleared = le.Uint64(b[sbCleared:])
	copy(sb.ArrayUUID[:], b[sbArrayUUID:])
	copy(sb.DeviceUUID[:], b[sbDeviceUUID:])
	// A valid checksum over nonsense is still nonsense: check every field.
	bad := func(format string, a ...any) (*superblock, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrBadSuperblock}, a...)...)
	}
	if hs := le.Uint32(b[sbVersion+4:]); hs != SuperblockSize {
		return bad("superblock size %d", hs)
	}
	if sb.Level != level5 {
		return bad("level %d (only RAID-5 is supported)", sb.Level)
	}
	lay := le.Uint32(b[sbLayout:])
	members := le.Uint32(b[sbMembers:])
	role := le.Uint32(b[sbRole:])
	if lay > 255 || members > stripe.MaxMembers || role >= members && role != 0xFFFFFFFF {
		return bad("layout %d, %d members, role %d", lay, members, role)
	}
	sb.Layout, sb.Members, sb.Role = stripe.Algorithm(lay), int(members), int(int32(role))
	for r, st := range sb.States {
		if st > roleRebuilding || r >= sb.Members && st != roleActive {
			return bad("role %d state %d", r, st)
		}
	}
	if _, err := stripe.NewLayout(sb.Members, sb.Chunk, sb.Layout); err != nil {
		return bad("%v", err)
	}
	if sb.DataOffset < ReservedOffset || sb.DataOffset%SuperblockSize != 0 ||
		sb.DataSize <= 0 || sb.DataSize%sb.Chunk != 0 || sb.DataSize > 1<<62-sb.DataOffset {
		return bad("data offset %d, data size %d", sb.DataOffset, sb.DataSize)
	}
	if sb.Recovery < 0 || sb.Recovery > sb.DataSize || sb.Recovery%sb.Chunk != 0 {
		return bad("recovery position %d", sb.Recovery)
	}
	switch le.Uint32(b[sbState:]) {
	case stateClean:
	case stateDirty:
		sb.Dirty = true
	default:
		return bad("state %d", le.Uint32(b[sbState:]))
	}
	if sb.Features&^knownFeatures != 0 {
		return bad("features %#x (this build knows %#x)", sb.Features, knownFeatures)
	}
	if sb.Features&featureBitmap != 0 {
		stripes := sb.DataSize / sb.Chunk
		if sb.BitmapOff != BitmapOffset || sb.BitmapRegion <= 0 || sb.BitmapRegion&(sb.BitmapRegion-1) != 0 ||
			sb.BitmapRegion > 1<<40 || sb.BitmapSize != bitmapBytes((stripes+sb.BitmapRegion-1)/sb.BitmapRegion) ||
			sb.BitmapSize > MaxBitmapBytes {
			return bad("bitmap at %d, %d bytes, %d stripes per bit", sb.BitmapOff, sb.BitmapSize, sb.BitmapRegion)
		}
	} else if sb.BitmapOff != 0 || sb.BitmapSize != 0 || sb.BitmapRegion != 0 {
		return bad("bitmap fields set without the bitmap feature")
	}
	jlen := le.Uint32(b[sbJournalLen:])
	if jlen > MaxJournalPath || jlen > 0 && sb.Features&featureJournal == 0 {
		return bad("journal path of %d bytes, features %#x", jlen, sb.Features)
	}
	sb.JournalPath = string(b[sbJournal : sbJournal+jlen])
	// A resume point belongs to a dirty array without a bitmap or journal (those are their
	// own checkpoints), inside the data area, on a stripe boundary.
	if sb.Resync < 0 || sb.Resync > sb.DataSize || sb.Resync%sb.Chunk != 0 ||
		sb.Resync != 0 && (!sb.Dirty || sb.Features&(featureBitmap|featureJournal) != 0) {
		return bad("resync position %d (dirty %v, features %#x)", sb.Resync, sb.Dirty, sb.Features)
	}
	if sb.Features&featureReAdd != 0 {
		if err := sb.decodeReAdd(b); err != nil {
			return nil, err
		}
	}
	return sb, nil
}

// decodeReAdd parses and checks the re-add record of sb (featureReAdd), from its encoding b.
func (sb *superblock) decodeReAdd(b []byte) error {
	le := binary.LittleEndian
	stripes := sb.DataSize / sb.Chunk
	r := &readdRecord{Unit: int64(le.Uint64(b[sbReAddUnit:])), Piece: int64(le.Uint64(b[sbReAddPiece:]))}
	nd, nm := le.Uint32(b[sbReAddDone:]), le.Uint32(b[sbReAddMap:])
	rebuilding := 0
	for _, st := range sb.States[:sb.Members] {
		if st == roleRebuilding {
			rebuilding++
		}
	}
	pow2 := func(x int64) bool { return x > 0 && x&(x-1) == 0 }
	if sb.Features&featureBitmap == 0 || rebuilding != 1 || !pow2(r.Unit) || !pow2(r.Piece) ||
		r.Unit > 1<<40 || r.Piece > 1<<40 || nd > readdExtra ||
		int64(nm) != ((stripes+r.Unit-1)/r.Unit+7)/8 || nm > readdMapMax {
		return fmt.Errorf("%w: re-add record: %d stripes per unit, %d per piece, %d pieces done, map of %d bytes, %d roles rebuilding, features %#x",
			ErrBadSuperblock, r.Unit, r.Piece, nd, nm, rebuilding, sb.Features)
	}
	pos := sb.Recovery / sb.Chunk
	if pos%r.Piece != 0 && pos != stripes {
		return fmt.Errorf("%w: re-add record: position %d not on a piece of %d stripes", ErrBadSuperblock, pos, r.Piece)
	}
	for i := range int(nd) {
		p := int64(le.Uint64(b[sbReAddList+8*i:]))
		if p <= pos/r.Piece || p > stripes/r.Piece || p*r.Piece >= stripes || slices.Contains(r.Done, p) {
			return fmt.Errorf("%w: re-add record: piece %d done, position %d, %d stripes per piece", ErrBadSuperblock, p, pos, r.Piece)
		}
		r.Done = append(r.Done, p)
	}
	r.Stale = slices.Clone(b[sbReAddStale : sbReAddStale+int(nm)])
	sb.ReAdd = r
	return nil
}
