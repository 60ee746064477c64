package raid

import (
	"sync"

	"github.com/raid5d/raid5d/raid/internal/journal"
)

// intentOps pools the journal op slices of the cache's write-outs.
var intentOps = sync.Pool{New: func() any { return new([]journal.Op) }}

// journaled reports whether the array keeps a journal, so callers build intent ops only then.
func (a *Array) journaled() bool { return a.jr != nil }

// writeIntent runs write, which writes stripes [s0, s0+n) as ops describe (ops are needed only
// when the array is journaled), between the bitmap's begin and end: the regions' bits are
// durable before it issues a member write and stay set until the cleaner sees the writes
// synced. With a journal, ops are logged durably before write runs. With neither it just runs
// write.
func (a *Array) writeIntent(s0, n int64, ops []journal.Op, write func() error) error {
	if a.bm == nil && a.jr == nil {
		return write()
	}
	if a.bm != nil {
		if err := a.bm.Begin(s0, n); err != nil {
			a.bm.End(s0, n)
			return err
		}
		defer a.bm.End(s0, n)
	}
	if a.jr != nil {
		done, err := a.jr.Log(s0, n, ops)
		if err != nil {
			return err
		}
		defer done()
	}
	return write()
}
