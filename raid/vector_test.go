package raid

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// countMember counts the calls reaching a member.
type countMember struct {
	*fileMember
	reads, readvs, bufs atomic.Int64
}

func (c *countMember) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	return c.fileMember.ReadAt(p, off)
}

func (c *countMember) ReadvAt(bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	c.readvs.Add(1)
	c.bufs.Add(int64(len(bufs)))
	return c.fileMember.ReadvAt(bufs, off, iov)
}

// TestReadMergesMemberRanges reads 1 MiB (64 chunks of 16 KiB over 4 members) and checks
// that each member's ranges that are contiguous on it went out as one preadv — as many
// calls as the layout has runs, no plain reads — and that every byte is right, with no cache,
// with a cold cache, and with part of the range cached (those stripes read one by one).
func TestReadMergesMemberRanges(t *testing.T) {
	dir := t.TempDir()
	const chunk, msize = 16 << 10, DataOffset + 4<<20
	paths := make([]string, 4)
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("m%d.img", i))
	}
	a, err := Create(paths, CreateOptions{Chunk: chunk, MemberSize: msize, IOOptions: IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	size, _ := a.Size()
	model := make([]byte, size)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range model {
		model[i] = byte(rng.Uint32())
	}
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	const off, n = 3*chunk + 5*512, 1 << 20 // starts mid-stripe, not chunk-aligned
	for _, mode := range []struct {
		name   string
		io     IOOptions
		warmAt int64 // if > 0: write this array range first (its stripes get a cache head)
	}{{"write-through", IOOptions{StripeCache: -1}, 0}, {"cold-cache", IOOptions{}, 0}, {"partly-cached", IOOptions{}, off + 200<<10}} {
		t.Run(mode.name, func(t *testing.T) {
			cms := make([]*countMember, len(paths))
			ms := make([]Member, len(paths))
			for i, p := range paths {
				m, err := OpenMember(p, false)
				if err != nil {
					t.Fatal(err)
				}
				cms[i] = &countMember{fileMember: m.(*fileMember)}
				ms[i] = cms[i]
			}
			a, err := AssembleMembers(ms, AssembleOptions{IOOptions: mode.io})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			cached := int64(0)
			if mode.warmAt > 0 {
				w := model[mode.warmAt : mode.warmAt+chunk]
				if _, err := a.WriteAt(w, mode.warmAt); err != nil {
					t.Fatal(err)
				}
				if err := a.Flush(); err != nil { // written out now, not during the read
					t.Fatal(err)
				}
				cached = 1
			}
			for _, c := range cms {
				c.reads.Store(0)
				c.readvs.Store(0)
				c.bufs.Store(0)
			}
			got := make([]byte, n)
			if k, err := a.ReadAt(got, off); err != nil || k != n {
				t.Fatalf("ReadAt = %d, %v", k, err)
			}
			if i := firstDiff(got, model[off:]); i < n {
				t.Fatalf("byte %d of the read differs from what was written", i)
			}
			exts := a.layout.Extents(nil, off, n)
			// runs: member ranges contiguous on their member; single: runs of one extent (a
			// plain pread); inRuns: extents in longer runs (preadv buffers).
			runs, single, inRuns := 0, 0, 0
			for r := range cms {
				end, k := int64(-1), 0
				for _, e := range exts {
					if e.Member != r {
						continue
					}
					if e.MemberOff != end {
						runs++
						if k == 1 {
							single++
						}
						k = 0
					}
					k++
					end = e.MemberOff + e.Len
				}
				if k == 1 {
					single++
				}
			}
			inRuns = len(exts) - single
			var reads, readvs, bufs int64
			for _, c := range cms {
				reads += c.reads.Load()
				readvs += c.readvs.Load()
				bufs += c.bufs.Load()
			}
			t.Logf("%d extents, %d runs (%d of one extent): %d preadv of %d buffers, %d pread", len(exts), runs, single, readvs, bufs, reads)
			if runs >= len(exts)/2 {
				t.Fatalf("%d runs for %d extents: the test needs a request with long runs", runs, len(exts))
			}
			if cached == 0 && (reads != int64(single) || readvs != int64(runs-single) || bufs != int64(inRuns)) {
				t.Fatalf("%d pread, %d preadv of %d buffers; want %d, %d, %d", reads, readvs, bufs, single, runs-single, inRuns)
			}
			if cached > 0 {
				// Extents in stripes with a head go one by one through the cache (at most a
				// read each, none if the head holds them); the rest still merge.
				heads := make([]uint64, 1)
				s0 := exts[0].Stripe
				a.cache.Heads(s0, exts[len(exts)-1].Stripe-s0+1, heads)
				inHeads := 0
				for _, e := range exts {
					if b := e.Stripe - s0; heads[b/64]&(1<<(b%64)) != 0 {
						inHeads++
					}
				}
				if inHeads == 0 || readvs == 0 || readvs > int64(runs) || reads > int64(single+inHeads) {
					t.Fatalf("partly cached: %d pread, %d preadv for %d extents in stripes with a head; want some preadv, at most %d, and at most %d pread",
						reads, readvs, inHeads, runs, single+inHeads)
				}
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
