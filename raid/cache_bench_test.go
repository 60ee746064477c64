package raid_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// benchArray returns an array of n in-memory members with chunk-sized chunks, 64 stripes.
func benchArray(b *testing.B, n int, chunk int64, io raid.IOOptions) *raid.Array {
	b.Helper()
	ms := newMems("b", n, raid.DataOffset+64*chunk)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: chunk, IOOptions: io})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}

var benchModes = []struct {
	name   string
	io     raid.IOOptions
	pinned bool
}{
	{"copy", raid.IOOptions{}, false},
	{"stable", raid.IOOptions{StablePages: true}, false},
	{"pinned", raid.IOOptions{StablePages: true}, true},
	{"cacheless", raid.IOOptions{StripeCache: -1}, false},
}

// BenchmarkFullStripe writes whole stripes, one per op, over in-memory members: the array's
// own cost (parity, locking, the copy when stable pages are off) plus a memcpy per member
// byte. copied/B is the bytes copied into the cache per byte written (0 with stable pages).
func BenchmarkFullStripe(b *testing.B) {
	for _, n := range []int{4, 8} {
		for _, m := range benchModes {
			b.Run(fmt.Sprintf("%s-n%d-c64k", m.name, n), func(b *testing.B) {
				a := benchArray(b, n, 64<<10, m.io)
				ss := a.Layout().StripeSize()
				stripes := mustSize(a) / ss
				p := make([]byte, ss)
				fill(newRand(4), p)
				release := func() {}
				b.SetBytes(ss)
				b.ReportAllocs()
				before := a.Counters()
				i := int64(0)
				for b.Loop() {
					off := (i % stripes) * ss
					var err error
					if m.pinned {
						_, err = a.WritePinned(p, off, release)
					} else {
						_, err = a.WriteAt(p, off)
					}
					if err != nil {
						b.Fatal(err)
					}
					i++
				}
				c := a.Counters()
				b.ReportMetric(float64(c.CopiedBytes-before.CopiedBytes)/float64(i*ss), "copied/B")
				b.ReportMetric(float64(c.MemberBytesRead-before.MemberBytesRead)/float64(i*ss), "read/B")
			})
		}
	}
}

// BenchmarkSeq4K writes 4 KiB at a time in sequence, wrapping around the array, and writes out
// the cache at the end (timed): with the cache against without. read/B is member bytes read per
// byte written.
func BenchmarkSeq4K(b *testing.B) {
	for _, m := range benchModes {
		b.Run(m.name+"-n4-c64k", func(b *testing.B) {
			a := benchArray(b, 4, 64<<10, m.io)
			size := mustSize(a)
			const unit = 4 << 10
			bufs := make([][]byte, 64)
			for i := range bufs {
				bufs[i] = make([]byte, unit)
				fill(newRand(uint64(i)), bufs[i])
			}
			release := func() {}
			b.SetBytes(unit)
			b.ReportAllocs()
			before := a.Counters()
			b.ResetTimer()
			for i := range b.N {
				off := int64(i) * unit % size
				p := bufs[i%len(bufs)]
				var err error
				if m.pinned {
					_, err = a.WritePinned(p, off, release)
				} else {
					_, err = a.WriteAt(p, off)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if err := a.Flush(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			c := a.Counters()
			w := float64(b.N) * unit
			b.ReportMetric(float64(c.MemberBytesRead-before.MemberBytesRead)/w, "read/B")
			b.ReportMetric(float64(c.FullStripeWrites-before.FullStripeWrites), "full-stripes")
		})
	}
}

// fillFlushed writes a 1 MiB buffer of random bytes over a, one MiB after another up to its
// last whole MiB, flushes, and returns the buffer.
func fillFlushed(b *testing.B, a *raid.Array) []byte {
	buf := make([]byte, 1<<20)
	fill(newRand(1), buf)
	for off := int64(0); off+int64(len(buf)) <= mustSize(a); off += int64(len(buf)) {
		if _, err := a.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		b.Fatal(err)
	}
	return buf
}

// cpuTime is the process's user+system CPU time in ns: with the machine shared, CPU per op is
// steadier than wall time per op.
func cpuTime(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkFiles drives the array over real member files the way test/bench/peers.sh does
// (4 members, 16 KiB chunks, on /dev/shm where it exists), one request at a time, so that
// the system calls are real: sequential 1 MiB and 48 KiB (one full stripe) writes, 1 MiB
// sequential and 4 KiB random reads, 4 KiB random writes (flushed at the end, timed). With
// the cache copying (default), with stable pages, and with small member reads through the
// members' mappings (MappedReads; ReadAt only: the server's ReadMapped is not in it).
// cpu-ns/op is the whole process's CPU time per request (member I/O goroutines included).
func BenchmarkFiles(b *testing.B) {
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = ""
	}
	for _, m := range []struct {
		name string
		io   raid.IOOptions
	}{{"copy", raid.IOOptions{}}, {"stable", raid.IOOptions{StablePages: true}},
		{"mapped", raid.IOOptions{MappedReads: true}}} {
		d, err := os.MkdirTemp(dir, "raid5d-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		paths := make([]string, 4)
		for i := range paths {
			paths[i] = filepath.Join(d, fmt.Sprintf("m%d.img", i))
		}
		const chunk = 16 << 10
		a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + 32<<20, IOOptions: m.io})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { a.Close() })
		size := mustSize(a)
		buf := fillFlushed(b, a)
		for _, c := range []struct {
			name   string
			size   int64
			write  bool
			random bool
		}{{"seqwrite-1M", 1 << 20, true, false}, {"seqwrite-48k", 48 << 10, true, false},
			{"seqread-1M", 1 << 20, false, false}, {"randread-4k", 4 << 10, false, true}, {"randwrite-4k", 4 << 10, true, true}} {
			b.Run(m.name+"-"+c.name, func(b *testing.B) {
				p := buf[:c.size]
				rng := newRand(2)
				n := size / c.size
				b.SetBytes(c.size)
				b.ReportAllocs()
				cpu0 := cpuTime(b)
				i := int64(0)
				for b.Loop() {
					off := (i % n) * c.size
					if c.random {
						off = rng.Int64N(n) * c.size
					}
					var err error
					if c.write {
						_, err = a.WriteAt(p, off)
					} else {
						_, err = a.ReadAt(p, off)
					}
					if err != nil {
						b.Fatal(err)
					}
					i++
				}
				if err := a.Flush(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(i), "cpu-ns/op")
			})
		}
		// 16 requests in flight (8 per P on 2 cores), as fio's iodepth 16 through the daemon:
		// sequential 48 KiB full-stripe writes and 4 KiB random reads.
		for _, c := range []struct {
			name  string
			size  int64
			write bool
		}{{"seqwrite-48k-qd16", 48 << 10, true}, {"randread-4k-qd16", 4 << 10, false}} {
			b.Run(m.name+"-"+c.name, func(b *testing.B) {
				var next, ops atomic.Int64
				n := size / c.size
				b.SetBytes(c.size)
				b.ReportAllocs()
				b.SetParallelism(8)
				cpu0 := cpuTime(b)
				b.RunParallel(func(pb *testing.PB) {
					p := bytes.Clone(buf[:c.size])
					rng := newRand(uint64(next.Add(1)))
					for pb.Next() {
						off := (next.Add(1) % n) * c.size
						var err error
						if c.write {
							_, err = a.WriteAt(p, off)
						} else {
							_, err = a.ReadAt(p, rng.Int64N(n)*c.size)
						}
						if err != nil {
							b.Error(err)
							return
						}
						ops.Add(1)
					}
				})
				if err := a.Flush(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(ops.Load()), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkServedRandWrite4K is peers.sh's randwrite-4k job without the NBD server: 4 KiB
// writes at random offsets, one at a time, over 4 member files on /dev/shm (16 KiB chunks, filled
// first) with stable pages and mapped reads, as raid5d serve sets them. through: the cache has no
// heads, so each write's read-modify-write runs in the caller (a write-out's cost alone);
// cached: writes land in the cache and its goroutines write them out (flushed at the end,
// timed); placed: with mapped writes, through WriteCached as the NBD server's reader calls it
// (placed read-modify-writes, rmw.go; what it declines, WriteAt). cpu-ns/op is the whole
// process's CPU time per write. (BenchmarkRandWrite4K measures the write-intent bitmap's cost.)
func BenchmarkServedRandWrite4K(b *testing.B) {
	for _, m := range []struct {
		name   string
		cache  int
		placed bool
	}{{"through", -1, false}, {"cached", 0, false}, {"placed", 0, true}} {
		b.Run(m.name, func(b *testing.B) {
			a, err := raid.Create(memberPaths(shmDir(b), 4), raid.CreateOptions{Chunk: 16 << 10, MemberSize: raid.DataOffset + 64<<20,
				IOOptions: raid.IOOptions{StripeCache: m.cache, StablePages: true, MappedReads: true, MappedWrites: m.placed}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { a.Close() })
			p, rng, n := fillFlushed(b, a)[:4<<10], newRand(2), mustSize(a)/(4<<10)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			cpu0, i := cpuTime(b), 0
			for b.Loop() {
				off := rng.Int64N(n) * int64(len(p))
				if m.placed && a.WriteCached(p, off, func() {}) {
					i++
					continue
				}
				if _, err := a.WriteAt(p, off); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if err := a.Flush(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(i), "cpu-ns/op")
		})
	}
}
