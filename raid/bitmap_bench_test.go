package raid_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// shmDir returns a fresh directory on /dev/shm (a tmpfs: fdatasync is cheap, so the figures
// show the bitmap's CPU and locking cost, not a disk's), or skips.
func shmDir(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "raid5d-bench-")
	if err != nil {
		b.Skip("no /dev/shm:", err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// BenchmarkRandWrite4K: random 4 KiB writes from 4 goroutines over a 4-member array of files
// on /dev/shm (64 KiB chunks, 3×32 MiB), with and without the write-intent bitmap, cached and
// cacheless, from a freshly created array (every region's bit clear at the start: the
// bitmap's worst case). bmflush/op is bitmap writes per write. Compare with benchstat, or
// the ratios TestBitmapCost prints.
func BenchmarkRandWrite4K(b *testing.B) {
	for _, cache := range []struct {
		name string
		n    int
	}{{"cached", 0}, {"cacheless", -1}} {
		for _, bm := range []struct {
			name   string
			region int64
		}{{"bitmap", 0}, {"none", -1}} {
			b.Run(cache.name+"/"+bm.name, func(b *testing.B) {
				const members, memberData = 4, 32 << 20
				paths := memberPaths(shmDir(b), members)
				a, err := raid.Create(paths, raid.CreateOptions{Chunk: 64 << 10, MemberSize: raid.DataOffset + memberData,
					BitmapRegion: bm.region, IOOptions: raid.IOOptions{StripeCache: cache.n}})
				if err != nil {
					b.Fatal(err)
				}
				defer a.Close()
				blocks := mustSize(a) / 4096
				var seed atomic.Uint64
				b.SetBytes(4096)
				b.ReportAllocs()
				b.SetParallelism(2) // 4 goroutines on 2 cores
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					rng := rand.New(rand.NewPCG(seed.Add(1), 1))
					buf := make([]byte, 4096)
					fill(rng, buf)
					for pb.Next() {
						if _, err := a.WriteAt(buf, rng.Int64N(blocks)*4096); err != nil {
							b.Error(err)
							return
						}
					}
				})
				if err := a.Flush(); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if st := a.Status(); st.Bitmap != nil {
					b.ReportMetric(float64(st.Bitmap.Flushes)/float64(b.N), "bmflush/op")
				}
			})
		}
	}
}

// BenchmarkResync: assembly after a crash in which random 4 KiB writes touched 1% of the
// array's regions, until the resync has ended: with the bitmap (only those regions) and
// without (everything). resyncB/op is member data-area bytes resynced per member.
func BenchmarkResync(b *testing.B) {
	for _, bm := range []struct {
		name   string
		region int64
	}{{"bitmap", 0}, {"full", -1}} {
		b.Run(bm.name, func(b *testing.B) {
			dir := shmDir(b)
			const members, memberData = 4, 32 << 20
			paths := memberPaths(dir, members)
			a, err := raid.Create(paths, raid.CreateOptions{Chunk: 64 << 10, MemberSize: raid.DataOffset + memberData,
				BitmapRegion: bm.region})
			if err != nil {
				b.Fatal(err)
			}
			// Regions: 512 stripes of 192 KiB, one bit each by default.
			rng := rand.New(rand.NewPCG(5, 6))
			buf := make([]byte, 4096)
			fill(rng, buf)
			ss := a.Layout().StripeSize()
			stripes := mustSize(a) / ss
			for range stripes / 100 {
				if _, err := a.WriteAt(buf, rng.Int64N(stripes)*ss+rng.Int64N(ss/4096)*4096); err != nil {
					b.Fatal(err)
				}
			}
			if err := a.Flush(); err != nil {
				b.Fatal(err)
			}
			crashed := memberPaths(filepath.Join(dir, "crashed"), members)
			os.Mkdir(filepath.Join(dir, "crashed"), 0o755)
			for i := range paths {
				copyFileB(b, paths[i], crashed[i])
			}
			a.Close()
			work := memberPaths(filepath.Join(dir, "work"), members)
			os.Mkdir(filepath.Join(dir, "work"), 0o755)
			var total int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for i := range crashed {
					copyFileB(b, crashed[i], work[i])
				}
				b.StartTimer()
				c, err := raid.Assemble(work, raid.AssembleOptions{IOOptions: fastSync})
				if err != nil {
					b.Fatal(err)
				}
				var p raid.Progress
				for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
					if st := c.Status(); st.LastResync != nil && st.Sync == nil {
						p = *st.LastResync
						break
					}
				}
				if p.Done == 0 || p.Done != p.Total {
					b.Fatalf("resync: %+v", p)
				}
				total += p.Total
				c.Close()
			}
			b.ReportMetric(float64(total)/float64(b.N), "resyncB/op")
		})
	}
}

func copyFileB(b *testing.B, from, to string) {
	b.Helper()
	src, err := os.Open(from)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		b.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
}

// TestBitmapCost (run with RAID5D_BENCH=1; it takes about 30 s) measures what
// BenchmarkRandWrite4K and BenchmarkResync do, but interleaved round by round, so that a noisy
// shared machine affects both sides alike, and logs the ratios for the note.
func TestBitmapCost(t *testing.T) {
	if os.Getenv("RAID5D_BENCH") == "" {
		t.Skip("set RAID5D_BENCH=1 to measure")
	}
	dir, err := os.MkdirTemp("/dev/shm", "raid5d-cost-")
	if err != nil {
		t.Skip("no /dev/shm")
	}
	defer os.RemoveAll(dir)
	type cfg struct {
		name          string
		cache, region int64
	}
	cfgs := []cfg{{"cached/bitmap", 0, 0}, {"cached/none", 0, -1}, {"cacheless/bitmap", -1, 0}, {"cacheless/none", -1, -1}}
	arrays := make([]*raid.Array, len(cfgs))
	for i, c := range cfgs {
		os.Mkdir(filepath.Join(dir, c.name[:3]+fmt.Sprint(i)), 0o755)
		a, err := raid.Create(memberPaths(filepath.Join(dir, c.name[:3]+fmt.Sprint(i)), 4), raid.CreateOptions{Chunk: 64 << 10,
			MemberSize: raid.DataOffset + 32<<20, BitmapRegion: c.region, IOOptions: raid.IOOptions{StripeCache: int(c.cache)}})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		arrays[i] = a
	}
	ops := make([]int64, len(cfgs))
	busy := make([]time.Duration, len(cfgs))
	for round := range 8 {
		for i, a := range arrays {
			blocks := mustSize(a) / 4096
			start := time.Now()
			var n atomic.Int64
			done := make(chan struct{})
			for g := range 4 {
				go func() {
					defer func() { done <- struct{}{} }()
					rng := rand.New(rand.NewPCG(uint64(round*8+g), uint64(i)))
					buf := make([]byte, 4096)
					fill(rng, buf)
					for time.Since(start) < 300*time.Millisecond {
						if _, err := a.WriteAt(buf, rng.Int64N(blocks)*4096); err != nil {
							t.Error(err)
							return
						}
						n.Add(1)
					}
				}()
			}
			for range 4 {
				<-done
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			ops[i] += n.Load()
			busy[i] += time.Since(start)
		}
	}
	rate := func(i int) float64 { return float64(ops[i]) / busy[i].Seconds() }
	for i, c := range cfgs {
		st := arrays[i].Status()
		fl := uint64(0)
		if st.Bitmap != nil {
			fl = st.Bitmap.Flushes
		}
		t.Logf("%-17s %8.0f writes/s (%.0f MB/s), %d bitmap writes for %d writes", c.name, rate(i), rate(i)*4096/1e6, fl, ops[i])
	}
	t.Logf("random 4K writes, bitmap/none: cached %.2f, cacheless %.2f", rate(0)/rate(1), rate(2)/rate(3))
}
