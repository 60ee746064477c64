package raid

import (
	"sync"

	"github.com/raid5d/raid5d/raid/internal/journal"
	"github.com/raid5d/raid5d/stripe"
)

// intentOps pools the journal op slices of the cache's write-outs.
var intentOps = sync.Pool{New: func() any { return new([]journal.Op) }}

// journaled reports whether the array keeps a journal, so callers build intent ops only then.
func (a *Array) journaled() bool { return a.jr != nil }

// appendJournalOps appends to jops the journal ops of the writes among ops, at absolute member
// offsets: one per write, one per buffer of a vectored write. The journal ops reference the
// writes' buffers.
func (a *Array) appendJournalOps(jops []journal.Op, ops []stripe.MemberOp) []journal.Op {
	for _, op := range ops {
		if !op.Write {
			continue
		}
		if op.Vec == nil {
			jops = append(jops, journal.Op{Role: op.Role, Off: a.dataOffset + op.Off, Buf: op.Buf})
			continue
		}
		off := a.dataOffset + op.Off
		for _, b := range op.Vec {
			jops = append(jops, journal.Op{Role: op.Role, Off: off, Buf: b})
			off += int64(len(b))
		}
	}
	return jops
}

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
