package loadgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Every unit (4 KiB, or the block size when that is smaller) written by the generator starts
// with a 32-byte header, little-endian:
//
//	0  u32  Magic ("R5BK")
//	4  u32  generation of the block (1 for its first write in a run, then 2, 3, ...)
//	8  u64  device byte offset of this unit
//	16 u64  seed of the run that wrote it
//	24 u32  writer (job) number
//	28 u32  CRC-32C of unit[32:] followed by unit[0:28]
//
// The rest of the unit is incompressible data from the Pool. The checksum covers every byte of
// the unit, so any changed byte is caught; it is computed payload first so the Pool can keep
// the payload CRCs precomputed and a write pays only for the 28 header bytes.
const (
	HeaderSize = 32
	Magic      = uint32('R') | uint32('5')<<8 | uint32('B')<<16 | uint32('K')<<24
	// MaxUnit is the unit size for blocks of 4 KiB and more; smaller blocks are one unit each.
	MaxUnit = 4096
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is the decoded unit header.
type Header struct {
	Gen    uint32
	Offset int64
	Seed   uint64
	Writer uint32
}

// Errors from DecodeHeader.
var (
	// ErrNoHeader: the unit does not start with Magic (never written by the generator).
	ErrNoHeader = errors.New("loadgen: no block header")
	// ErrChecksum: the header is there but the unit's checksum does not match its contents.
	ErrChecksum = errors.New("loadgen: block checksum mismatch")
)

// unitChecksum is the CRC-32C of unit[HeaderSize:] then unit[:28], given the payload's CRC.
func unitChecksum(unit []byte, payloadCRC uint32) uint32 {
	return crc32.Update(payloadCRC, castagnoli, unit[:28])
}

// PutHeader writes h into unit[:HeaderSize] and its checksum over the whole unit.
func PutHeader(unit []byte, h Header) {
	stamp(unit, h, crc32.Checksum(unit[HeaderSize:], castagnoli))
}

// stamp writes h given the CRC-32C of unit[HeaderSize:].
func stamp(unit []byte, h Header, payloadCRC uint32) {
	binary.LittleEndian.PutUint32(unit[0:4], Magic)
	binary.LittleEndian.PutUint32(unit[4:8], h.Gen)
	binary.LittleEndian.PutUint64(unit[8:16], uint64(h.Offset))
	binary.LittleEndian.PutUint64(unit[16:24], h.Seed)
	binary.LittleEndian.PutUint32(unit[24:28], h.Writer)
	binary.LittleEndian.PutUint32(unit[28:32], unitChecksum(unit, payloadCRC))
}

// DecodeHeader reads a unit's header and checks its checksum. It returns ErrNoHeader when the
// magic is absent and ErrChecksum (with the header as read) when any byte of the unit differs
// from what was checksummed. units shorter than HeaderSize+1 have no header.
func DecodeHeader(unit []byte) (Header, error) {
	if len(unit) <= HeaderSize || binary.LittleEndian.Uint32(unit[0:4]) != Magic {
		return Header{}, ErrNoHeader
	}
	h := Header{
		Gen:    binary.LittleEndian.Uint32(unit[4:8]),
		Offset: int64(binary.LittleEndian.Uint64(unit[8:16])),
		Seed:   binary.LittleEndian.Uint64(unit[16:24]),
		Writer: binary.LittleEndian.Uint32(unit[24:28]),
	}
	want := binary.LittleEndian.Uint32(unit[28:32])
	if got := unitChecksum(unit, crc32.Checksum(unit[HeaderSize:], castagnoli)); got != want {
		return h, fmt.Errorf("%w: stored %#08x, computed %#08x", ErrChecksum, want, got)
	}
	return h, nil
}

// describe says what a unit holds, for verify and check reports.
func describe(unit []byte, off int64) string {
	h, err := DecodeHeader(unit)
	switch {
	case err == nil && h.Offset != off:
		return fmt.Sprintf("misplaced block: header offset %d (gen %d, seed %#x)", h.Offset, h.Gen, h.Seed)
	case err == nil:
		return fmt.Sprintf("gen %d (seed %#x, writer %d)", h.Gen, h.Seed, h.Writer)
	case errors.Is(err, ErrChecksum):
		return fmt.Sprintf("corrupt block: checksum mismatch (header says gen %d, offset %d, seed %#x)", h.Gen, h.Offset, h.Seed)
	case isZero(unit):
		return "zeroes"
	}
	return fmt.Sprintf("foreign data (no header, crc32c %#08x)", crc32.Checksum(unit, castagnoli))
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
