package loadgen

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
)

// ErrViolation is returned by Check when some unit holds what the verify log says it cannot.
var ErrViolation = errors.New("loadgen: check found violations")

// CheckResult counts what Check found. Blocks are the run's I/O blocks; each is checked unit
// by unit (4 KiB, or the block size if smaller), since a crash may tear a large write.
type CheckResult struct {
	Blocks     int64 `json:"blocks"`
	Units      int64 `json:"units"`
	Written    int64 `json:"written"`   // blocks the run sent at least one write to
	Durable    int64 `json:"durable"`   // blocks with a write known durable
	Unchanged  int64 `json:"unchanged"` // units holding their contents from before the run
	Latest     int64 `json:"latest"`    // units of written blocks holding the last generation sent
	Violations int64 `json:"violations"`
	// First lists the first violations.
	First   []Mismatch `json:"first,omitempty"`
	Records int64      `json:"log_records"`
}

// Check reads back the region a verify log describes, through dev with iodepth requests in
// flight, and checks every unit:
//
//   - a block never written by the run holds its contents from before the run (same CRC-32C);
//   - a block with a durable generation d holds a generation in d..Max of this run's seed, at
//     the right offset, with a good checksum;
//   - any other written block holds a generation in 1..Max, or its contents from before.
//
// It returns ErrViolation (with the result) if any unit fails, and at most maxReport of them
// in detail.
func Check(ctx context.Context, dev Device, st *LogState, iodepth, maxReport int) (*CheckResult, error) {
	h := st.Header
	if iodepth <= 0 {
		iodepth = 16
	}
	blocks := h.Size / int64(h.BlockSize)
	res := &CheckResult{Blocks: blocks, Units: h.Size / int64(h.Unit), Records: st.Records}
	for b := range blocks {
		if st.Max[b] > 0 {
			res.Written++
		}
		if st.Durable[b] > 0 {
			res.Durable++
		}
	}
	var (
		next                         atomic.Int64
		unchanged, latest, violation atomic.Int64
		mu                           sync.Mutex // guards res.First, firstErr
		firstErr                     error
		wg                           sync.WaitGroup
	)
	for range iodepth {
		wg.Go(func() {
			buf := make([]byte, h.BlockSize)
			for ctx.Err() == nil {
				b := next.Add(1) - 1
				if b >= blocks {
					return
				}
				off := h.Offset + b*int64(h.BlockSize)
				if _, err := dev.ReadAt(buf, off); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("read of %d bytes at %d: %w", len(buf), off, err)
					}
					mu.Unlock()
					return
				}
				for k := 0; k < len(buf); k += h.Unit {
					unit, uoff := buf[k:k+h.Unit], off+int64(k)
					ui := (uoff - h.Offset) / int64(h.Unit)
					ok, isLatest, isInitial, expected := checkUnit(unit, uoff, st.Baseline[ui], st.Durable[b], st.Max[b], h.Seed)
					switch {
					case !ok:
						violation.Add(1)
						mu.Lock()
						if len(res.First) < maxReport {
							res.First = append(res.First, Mismatch{Offset: uoff, Expected: expected, Found: describe(unit, uoff)})
						}
						mu.Unlock()
					case isInitial:
						unchanged.Add(1)
					case isLatest:
						latest.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	res.Unchanged, res.Latest, res.Violations = unchanged.Load(), latest.Load(), violation.Load()
	if firstErr != nil {
		return res, firstErr
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if res.Violations > 0 {
		return res, fmt.Errorf("%w: %d of %d units", ErrViolation, res.Violations, res.Units)
	}
	return res, nil
}

// checkUnit decides whether unit (at device offset off) may hold what it holds, given its
// baseline CRC and its block's durable and maximum generations.
func checkUnit(unit []byte, off int64, baseline, durable, maxGen uint32, seed uint64) (ok, latest, initial bool, expected string) {
	initialOK := durable == 0 && crc32.Checksum(unit, castagnoli) == baseline
	if maxGen == 0 {
		return initialOK, false, initialOK, "its contents from before the run (never written)"
	}
	h, err := DecodeHeader(unit)
	if err == nil && h.Offset == off && h.Seed == seed && h.Gen >= max(durable, 1) && h.Gen <= maxGen {
		return true, h.Gen == maxGen, false, ""
	}
	if initialOK {
		return true, false, true, ""
	}
	if durable > 0 {
		return false, false, false, fmt.Sprintf("gen %d..%d (durable %d, seed %#x)", durable, maxGen, durable, seed)
	}
	return false, false, false, fmt.Sprintf("gen 1..%d (seed %#x) or its contents from before the run", maxGen, seed)
}
