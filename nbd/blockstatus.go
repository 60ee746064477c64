package nbd

import (
	"encoding/binary"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// Bounds of one NBD_CMD_BLOCK_STATUS reply. The protocol asks for at most 2^20 extents; a
// smaller bound keeps the per-request memory small (the extents and their wire form, about
// 24 bytes an extent, kept with the request for reuse), and a client asks again from where a
// short reply ended. The range handed to the Device is capped too, so that one request cannot
// make a device walk terabytes of metadata.
const (
	maxBlockStatusExtents = 4096
	maxBlockStatusLength  = 1 << 30
)

// blockStatus answers a BLOCK_STATUS for base:allocation: it asks the Device (a BlockStatuser;
// any other device is all data) about at most maxBlockStatusLength bytes from req.off, keeps
// the extents that are well-formed and within the range, merges neighbours with the same
// flags, and returns the descriptors' wire form (at most maxBlockStatusExtents, or one with
// NBD_CMD_FLAG_REQ_ONE; the protocol lets a reply cover less than asked). The result lives in
// req until its reply is written.
func (c *conn) blockStatus(req *request) ([]byte, error) {
	length := min(int64(req.length), maxBlockStatusLength)
	limit := maxBlockStatusExtents
	if req.flags&wire.CmdFlagReqOne != 0 {
		limit = 1
	}
	if req.extents == nil {
		req.extents = make([]Extent, 0, maxBlockStatusExtents)
		req.bsWire = make([]byte, 0, 8*maxBlockStatusExtents)
	}
	// The device gets room for every extent even under REQ_ONE: it may describe the range in
	// pieces finer than its runs (raid5d: chunk by chunk), merged below into the one sent.
	ext := append(req.extents[:0], Extent{Length: length})
	if bs, ok := c.sess.export.Device.(BlockStatuser); ok {
		var err error
		if ext, err = bs.BlockStatus(int64(req.off), length, req.extents[:0]); err != nil {
			return nil, err
		}
	}
	wire := req.bsWire[:0]
	var cur Extent // the extent being merged; Length 0 before the first
	covered := int64(0)
	for _, x := range ext {
		if x.Length <= 0 || x.Length > length-covered {
			break // a device that breaks its contract: keep what was sound
		}
		covered += x.Length
		x.Flags &= ExtentHole | ExtentZero
		if cur.Length > 0 && x.Flags == cur.Flags {
			cur.Length += x.Length
			continue
		}
		if cur.Length > 0 {
			if len(wire) == 8*limit {
				break
			}
			wire = appendExtent(wire, cur)
		}
		cur = x
	}
	switch {
	case cur.Length == 0:
		cur = Extent{Length: length} // nothing usable came back: data, which is always true
		fallthrough
	case len(wire) < 8*limit:
		wire = appendExtent(wire, cur)
	}
	return wire, nil
}

// appendExtent appends one block status descriptor: 32-bit length, 32-bit flags.
func appendExtent(b []byte, x Extent) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(x.Length))
	return binary.BigEndian.AppendUint32(b, uint32(x.Flags))
}
