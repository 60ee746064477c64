package main

import (
	"sync"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
)

// arrayDevice is the array as the NBD server sees it: every method of *raid.Array (so the
// optional nbd.FUAWriter and nbd.PinnedWriter come through), with BlockStatus translated into
// nbd's extent flags. raid does not import nbd (imports point down), so the translation is here.
type arrayDevice struct{ *raid.Array }

var (
	_ nbd.Device           = arrayDevice{}
	_ nbd.FUAWriter        = arrayDevice{}
	_ nbd.PinnedWriter     = arrayDevice{}
	_ nbd.BlockStatuser    = arrayDevice{}
	_ nbd.MappedReader     = arrayDevice{}
	_ nbd.PlacedWriter     = arrayDevice{}
	_ nbd.PlacedProgresser = arrayDevice{}
	_ nbd.CachedWriter     = arrayDevice{}
	_ nbd.WriteExpecter    = arrayDevice{}
)

// raidExtents pools BlockStatus's working slices (one per concurrent request).
var raidExtents = sync.Pool{New: func() any { return new([]raid.Extent) }}

// BlockStatus answers NBD_CMD_BLOCK_STATUS for base:allocation: the array's holes are
// NBD_STATE_HOLE|NBD_STATE_ZERO, its data 0. At most cap(dst) extents, as the array returns.
func (d arrayDevice) BlockStatus(off, length int64, dst []nbd.Extent) ([]nbd.Extent, error) {
	ep := raidExtents.Get().(*[]raid.Extent)
	defer raidExtents.Put(ep)
	if cap(*ep) < cap(dst) {
		*ep = make([]raid.Extent, 0, cap(dst))
	}
	ext, err := d.Array.BlockStatus(off, length, (*ep)[:0:max(cap(dst), 1)])
	*ep = ext[:0]
	dst = dst[:0]
	for _, e := range ext {
		f := nbd.ExtentFlags(0)
		if e.Hole {
			f = nbd.ExtentHole | nbd.ExtentZero
		}
		dst = append(dst, nbd.Extent{Length: e.Length, Flags: f})
	}
	return dst, err
}
