package raid_test

import (
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
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
// written through ("cacheless": StripeCache -1), from a freshly created array (every region's bit clear at the start: the
// bitmap's worst case). bmflush/op is bitmap writes per write (TestBitmapCost checks the
// counts exactly). Compare with benchstat.
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
				b.ReportAllocs()
				randWrite4K(b, a)
				if st := a.Status(); st.Bitmap != nil {
					b.ReportMetric(float64(st.Bitmap.Flushes)/float64(b.N), "bmflush/op")
				}
			})
		}
	}
}

// randWrite4K times b.N random 4 KiB writes over a from 4 goroutines, and the Flush after them.
func randWrite4K(b *testing.B, a *raid.Array) {
	blocks := mustSize(a) / 4096
	var seed atomic.Uint64
	b.SetBytes(4096)
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
}

// BenchmarkResync: assembly after a crash in which random 4 KiB writes touched 1% of the
// array's regions, until the resync has ended: with the bitmap (only those regions) and
// without (everything). resyncB/op is member data-area bytes resynced per member.
func BenchmarkResync(b *testing.B) {
	for _, bm := range []struct {
		name   string
		region int64
	}{{"bitmap", 192 << 10}, {"full", -1}} {
		b.Run(bm.name, func(b *testing.B) {
			dir := shmDir(b)
			const members, memberData = 4, 32 << 20
			paths := memberPaths(dir, members)
			a, err := raid.Create(paths, raid.CreateOptions{Chunk: 64 << 10, MemberSize: raid.DataOffset + memberData,
				BitmapRegion: bm.region})
			if err != nil {
				b.Fatal(err)
			}
			// Regions: 512 stripes of 192 KiB, a bit each (the default would be 6 MiB).
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

// TestBitmapCost counts what the write-intent bitmap costs the members under random 4 KiB
// writes (through the cache, from a fresh array, so every first write to a region sets its
// bit): each bitmap write is one page and one sync per member, and there is at most one per
// region written — a write to a region whose bit is already durable costs no member I/O.
// The cleaner is stopped, so that no bit is cleared (and set again) however slowly the
// machine runs: the counts are exact, never timed. BenchmarkRandWrite4K measures the speed.
func TestBitmapCost(t *testing.T) {
	const members, memberData, C, writes = 4, 16 << 20, 64 << 10, 4000
	fs := make([]*raidtest.Faulty, members)
	for i, m := range newMems("m", members, raid.DataOffset+memberData) {
		fs[i] = raidtest.NewFaulty(m)
	}
	a, err := raid.CreateMembers(asMembers(fs), raid.CreateOptions{Chunk: C})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	raid.StopBitmapCleaner(a)
	var pageWrites, syncs [members]atomic.Int64
	for i, f := range fs {
		f.SetHook(func(op raidtest.Op, off int64) {
			switch {
			case op == raidtest.OpWrite && off >= raid.BitmapOffset && off < raid.BitmapOffset+raid.MaxBitmapBytes:
				pageWrites[i].Add(1)
			case op == raidtest.OpSync:
				syncs[i].Add(1)
			}
		})
	}
	region := a.Status().Bitmap.RegionBytes
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 4096)
	fill(rng, buf)
	touched := map[int64]bool{}
	blocks := mustSize(a) / 4096
	for range writes {
		off := rng.Int64N(blocks) * 4096
		touched[off/region] = true
		if _, err := a.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	st := a.Status().Bitmap
	if st.Flushes == 0 || st.Flushes > uint64(len(touched)) {
		t.Errorf("%d bitmap writes for %d writes to %d regions, want 1 to %d", st.Flushes, writes, len(touched), len(touched))
	}
	for i := range fs {
		if got := pageWrites[i].Load(); got != int64(st.Flushes) {
			t.Errorf("member %d: %d bitmap page writes for %d bitmap writes, want one each", i, got, st.Flushes)
		}
		// Faulty members have no RWF_DSYNC: each bitmap write syncs, and so do the
		// superblock's dirty mark (the first write) and the Flush.
		if got := syncs[i].Load(); got != int64(st.Flushes)+2 {
			t.Errorf("member %d: %d syncs for %d bitmap writes, the dirty mark and one Flush", i, got, st.Flushes)
		}
	}
	t.Logf("%d writes to %d of %d regions: %d bitmap writes (%d waited)", writes, len(touched), st.Regions, st.Flushes, st.Waits)
}

// TestBitmapSequential: a sequential writer on a small array with the default region waits
// for a bitmap write at most once per DefaultBitmapMinRegion it writes (plus one: a start
// inside a region). Before the floor, an array of 96 MiB had a region per 48 KiB stripe and
// every full-stripe write of a stream waited for one (the kernel client's 48 KiB writes in
// the VM: 0.3× md+nbdkit). The cleaner is stopped, so the count is exact.
func TestBitmapSequential(t *testing.T) {
	const members, memberData, C, stream = 4, 32 << 20, 16 << 10, 16 << 20
	a, err := raid.CreateMembers(asMembers(newMems("m", members, raid.DataOffset+memberData)), raid.CreateOptions{Chunk: C})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	raid.StopBitmapCleaner(a)
	if r := a.Status().Bitmap.RegionBytes; r < raid.DefaultBitmapMinRegion {
		t.Errorf("default region %d bytes, want at least %d", r, raid.DefaultBitmapMinRegion)
	}
	stripe := a.Layout().StripeSize()
	buf := make([]byte, stripe)
	fill(rand.New(rand.NewPCG(5, 6)), buf)
	for off := int64(0); off+stripe <= stream; off += stripe {
		if _, err := a.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	st := a.Status().Bitmap
	if most := uint64(stream/raid.DefaultBitmapMinRegion + 1); st.Flushes == 0 || st.Flushes > most {
		t.Errorf("%d bitmap writes for %d bytes written in %d-byte stripes, in order; want 1 to %d", st.Flushes, stream, stripe, most)
	}
	t.Logf("%d regions of %d bytes: %d bitmap writes (%d waited)", st.Regions, st.RegionBytes, st.Flushes, st.Waits)
}
