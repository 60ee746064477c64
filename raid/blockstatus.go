package raid

import (
	"fmt"

	"github.com/raid5d/raid5d/stripe"
)

// blockStatusGrain is the granularity of BlockStatus: holes are reported in whole, aligned
// 4 KiB blocks of the array (the cache's unit, and the usual file system block).
const blockStatusGrain = 4096

// Extent is a run of the array as BlockStatus describes it: Length bytes that are all a hole
// (unallocated on the members, reading as zeroes) or all data.
type Extent struct {
	Length int64
	Hole   bool
}

// BlockStatus describes [off, off+length) of the array for NBD's base:allocation context
// (cmd/raid5d serves it as nbd.BlockStatuser): it appends extents to dst[:0], in order from
// off, covering at least one byte and at most length bytes (fewer once the result reaches
// cap(dst)), and returns them. A 4 KiB block of the array is a hole (Extent.Hole) only when
// it certainly reads as zeroes:
//
//   - its stripe is whole (no member missing, faulty or still rebuilding there): a degraded
//     stripe is reported as data, although it may read as zeroes, since its data chunks may be
//     rebuilt from the others rather than read;
//   - the member holding its data chunk is a regular file with a hole there (lseek
//     SEEK_DATA/SEEK_HOLE); block devices and other members are reported as data;
//   - its stripe has no dirty units in the stripe cache (Cache.Dirty): data not yet written
//     to the members; such a stripe is data as a whole.
//
// Everything else is data (flags 0), which is always a true answer. Each stripe is examined
// under its lock, as a write or a write-out holds it throughout: a write that returned before
// BlockStatus started is either dirty in the cache or on the members by then, so a range is
// never called a hole after a write to it has returned. A trim of whole stripes punches holes
// in every member, so trimmed stripes are holes again.
func (a *Array) BlockStatus(off, length int64, dst []Extent) ([]Extent, error) {
	dst = dst[:0]
	if err := a.check(off, length); err != nil {
		return dst, err
	}
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return dst, ErrClosed
	}
	if length == 0 {
		return dst, nil
	}
	limit := max(cap(dst), 1)
	add := func(n int64, hole bool) bool { // false once dst is full
		if k := len(dst); k > 0 && dst[k-1].Hole == hole {
			dst[k-1].Length += n
			return true
		}
		if len(dst) == limit {
			return false
		}
		dst = append(dst, Extent{Length: n, Hole: hole})
		return true
	}
	S := a.layout.StripeSize()
	end := off + length
	var exts [stripe.MaxMembers]stripe.Extent
	for pos := off; pos < end; {
		s := pos / S
		n := min(end, (s+1)*S) - pos
		pieces := a.layout.Extents(exts[:0], pos, n) // the stripe's data chunks in the range
		lk := a.locks.For(s)
		lk.Lock()
		whole := a.roles.missingAt(s) < 0 && (a.cache == nil || !a.cache.Dirty(s, 1))
		for _, e := range pieces {
			if !whole {
				if !add(e.Len, false) {
					lk.Unlock()
					return dst, nil
				}
				continue
			}
			if full, err := a.pieceStatus(e, pos+e.BufOff, add); err != nil || full {
				lk.Unlock()
				return dst, err
			}
		}
		lk.Unlock()
		pos += n
	}
	return dst, nil
}

// pieceStatus adds the extents of one piece e of a whole stripe at array offset at: holes
// where its member has a hole, shrunk to whole 4 KiB blocks of the array, data elsewhere. It
// reports whether add ran out of room. The caller holds the stripe's lock.
func (a *Array) pieceStatus(e stripe.Extent, at int64, add func(int64, bool) bool) (full bool, err error) {
	var f holeFinder
	if m := a.roles.usable(e.Member, e.Stripe); m != nil {
		f, _ = m.Member.(holeFinder)
	}
	if f == nil {
		return !add(e.Len, false), nil
	}
	base := a.dataOffset + e.MemberOff // member offset of array offset at
	pos, end := base, base+e.Len
	for pos < end {
		d, known, err := f.NextData(pos, end)
		if err != nil {
			return false, fmt.Errorf("raid: block status: %w", err)
		}
		if !known {
			return !add(end-pos, false), nil
		}
		// [pos, d) is a hole. Where its edges come from lseek, keep the whole 4 KiB blocks of
		// the array inside it and call the slivers data (a file system with smaller blocks);
		// the piece's own edges are chunk boundaries or the request's.
		if d > pos {
			h0, h1 := pos, d
			if pos > base {
				h0 = alignUp(pos-base+at, blockStatusGrain) - at + base
			}
			if d < end {
				h1 = alignDown(d-base+at, blockStatusGrain) - at + base
			}
			if h1 <= h0 {
				h0, h1 = pos, pos // no whole block: all data
			}
			if (h0 > pos && !add(h0-pos, false)) || (h1 > h0 && !add(h1-h0, true)) ||
				(d > h1 && !add(d-h1, false)) {
				return true, nil
			}
		}
		if d >= end {
			break
		}
		h, err := f.NextHole(d, end)
		if err != nil {
			return false, fmt.Errorf("raid: block status: %w", err)
		}
		if h <= d { // cannot happen on a sane file system; do not loop for ever
			h = end
		}
		if !add(h-d, false) {
			return true, nil
		}
		pos = h
	}
	return false, nil
}

func alignUp(v, g int64) int64   { return (v + g - 1) / g * g }
func alignDown(v, g int64) int64 { return v / g * g }
