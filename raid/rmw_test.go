package raid_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// TestPlacedRMW: short writes of whole 4 KiB units taken by WriteCached on an array with mapped
// writes are done in place (placed read-modify-writes: the data pwritten, the parity folded into
// its mapping) when their stripe has no cache head, and go to the cache or the ordinary write
// otherwise. Random writes of one to three units (some across a chunk boundary), mixed with
// unaligned writes that bind cache heads and with reads, with the cache on and off and stable
// pages on and off: every byte reads back as the model says, during the run and after a Flush,
// every stripe's parity on the member files is the XOR of its data, and the short writes were
// placed (their parity bytes counted as written through the mappings): all of them without a
// cache, a good part with one.
func TestPlacedRMW(t *testing.T) {
	for _, cached := range []bool{true, false} {
		for _, stable := range []bool{false, true} {
			t.Run(fmt.Sprintf("cache=%v/stable=%v", cached, stable), func(t *testing.T) {
				opts := raid.CreateOptions{}
				opts.IOOptions.StablePages = stable
				opts.IOOptions.WriteBackDelay = time.Millisecond
				if !cached {
					opts.IOOptions.StripeCache = -1
				}
				a, paths, model := mappedArray(t, opts)
				l := a.Layout()
				ss := l.StripeSize()
				units := int64(len(model)) / 4096
				rng := newRand(41)
				buf := make([]byte, 3*4096)
				before := a.Counters()
				const writes = 3000
				placed, tried := 0, 0
				for i := range writes {
					switch {
					case i%10 == 9: // an unaligned write: a cache head, or a write-through
						n := 1 + rng.IntN(6000)
						off := rng.Int64N(int64(len(model) - n))
						fill(rng, buf[:n])
						if _, err := a.WriteAt(buf[:n], off); err != nil {
							t.Fatal(err)
						}
						copy(model[off:], buf[:n])
					case i%10 == 4: // a read of a few units around a random one
						off := max(0, rng.Int64N(units)*4096-4096)
						n := min(3*4096, int64(len(model))-off)
						got := make([]byte, n)
						if _, err := a.ReadAt(got, off); err != nil {
							t.Fatal(err)
						}
						if d := firstDiff(got, model[off:off+n]); d < int(n) {
							t.Fatalf("write %d: read at %d differs from the model at byte %d", i, off, d)
						}
					default:
						k := int64(1 + rng.IntN(3))
						u := rng.Int64N(units)
						off := u * 4096
						if off/ss != (off+k*4096-1)/ss { // within one stripe
							k = (ss - off%ss) / 4096
						}
						p := make([]byte, k*4096) // kept by the cache under stable pages
						fill(rng, p)
						tried++
						mw := a.Counters().MappedBytesWritten
						if a.WriteCached(p, off, func() {}) {
							if a.Counters().MappedBytesWritten == mw+uint64(len(p)) {
								placed++
							}
						} else if _, err := a.WriteAt(p, off); err != nil {
							t.Fatal(err)
						}
						copy(model[off:], p)
					}
				}
				compareArray(t, a, model)
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				compareArray(t, a, model)
				c := a.Counters()
				t.Logf("%d of %d short writes placed; %d RMW write-outs, %d RCW", placed, tried,
					c.RMWWrites-before.RMWWrites, c.RCWWrites-before.RCWWrites)
				// Without a cache every one is placed; with it, those that meet a dirty head
				// (bound by an unaligned write or a declined one, 1 ms ago) are not.
				if !cached && placed < tried || placed < tried/4 {
					t.Fatalf("only %d of %d short writes were placed read-modify-writes", placed, tried)
				}
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				checkMembers(t, paths, l, model, -1)
			})
		}
	}
}

// TestPlacedRMWAllocs: in steady state a placed read-modify-write allocates nothing (as
// TestWriteAllocs asks of the cache's paths): random 4 KiB writes through WriteCached on file
// members with mapped writes, every write-intent bit already set (the cleaner stopped), no GC
// during the count. Every write must have been placed.
func TestPlacedRMWAllocs(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations are not counted")
	}
	for _, stable := range []bool{false, true} {
		t.Run(fmt.Sprintf("stable=%v", stable), func(t *testing.T) {
			opts := raid.CreateOptions{}
			opts.IOOptions.StablePages = stable
			opts.IOOptions.WriteBackDelay = time.Microsecond
			a, _, model := mappedArray(t, opts)
			raid.StopBitmapCleaner(a)
			rng := newRand(42)
			p := make([]byte, 4096)
			fill(rng, p)
			n := int64(len(model)) / 4096
			release := func() {}
			missed := 0
			write := func() {
				if !a.WriteCached(p, rng.Int64N(n)*4096, release) {
					missed++
				}
			}
			for range 5000 {
				write()
			}
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
			const writes, runs, most = 2000, 5, 4
			missed = 0
			allocs := testing.AllocsPerRun(runs, func() {
				for range writes {
					write()
				}
			})
			t.Logf("%v allocations per %d writes; %d not placed", allocs, writes, missed)
			if missed > 0 {
				t.Fatalf("%d of %d writes not placed", missed, (runs+1)*writes)
			}
			if allocs > most {
				t.Errorf("%v allocations per %d placed read-modify-writes, want at most %d", allocs, writes, most)
			}
		})
	}
}

// TestPlacedRMWDeclines: a short write is not placed in a stripe whose cache head holds dirty
// units (they are newer than the members: the cache takes the write), nor in a degraded array
// or a journaled one; the writes still read back as the model says.
func TestPlacedRMWDeclines(t *testing.T) {
	a, paths, model := placedArray(t, raid.CreateOptions{}) // an hour's write-back delay
	ss := a.Layout().StripeSize()
	rng := newRand(43)
	write := func(what string, off int64, wantPlaced bool) {
		t.Helper()
		p := make([]byte, 4096)
		fill(rng, p)
		mw := a.Counters().MappedBytesWritten
		if !a.WriteCached(p, off, func() {}) {
			if _, err := a.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
		}
		copy(model[off:], p)
		if placed := a.Counters().MappedBytesWritten > mw; placed != wantPlaced {
			t.Fatalf("%s: placed %v, want %v", what, placed, wantPlaced)
		}
	}
	write("a clean stripe", 2*ss+8192, true)
	dirty := make([]byte, 1000)
	fill(rng, dirty)
	if _, err := a.WriteAt(dirty, 3*ss+100); err != nil {
		t.Fatal(err)
	}
	copy(model[3*ss+100:], dirty)
	write("a stripe with a dirty head", 3*ss+4096, false)
	write("the dirty head's unit", 3*ss, false)
	compareArray(t, a, model)
	if err := a.Fail(paths[1]); err != nil {
		t.Fatal(err)
	}
	write("degraded", 5*ss, false)
	compareArray(t, a, model)

	j, _, _ := placedArray(t, raid.CreateOptions{Consistency: raid.ConsistencyJournal,
		JournalPath: filepath.Join(modeDir(t, ioMode{shm: true}), "journal"), JournalSize: 2 << 20})
	mw := j.Counters().MappedBytesWritten
	if j.WriteCached(make([]byte, 4096), 0, nil) && j.Counters().MappedBytesWritten != mw {
		t.Fatal("a short write placed on a journaled array")
	}
}

// TestPlacedRMWShrunk: a member file truncated to half under an array taking placed
// read-modify-writes is never a source of zeroes. A short write to a stripe in the truncated
// half, where the member holds the parity or the written data chunk, faults in the fold (its
// pages are gone; the range was known to be in memory): it is not placed, the stripe's parity
// is rewritten through the members, which fails the truncated one, and the write then goes to
// the cache or through WriteAt. Random 4 KiB writes follow; every byte reads back as written,
// and the member is faulty.
func TestPlacedRMWShrunk(t *testing.T) {
	for _, role := range []string{"parity", "data"} {
		for _, cached := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/cache=%v", role, cached), func(t *testing.T) {
				opts := raid.CreateOptions{}
				opts.IOOptions.WriteBackDelay = time.Millisecond
				opts.IOOptions.ReadErrorLimit = 1000 // failed by its writes, not by counted read errors
				if !cached {
					opts.IOOptions.StripeCache = -1
				}
				a, paths, model := mappedArray(t, opts)
				l := a.Layout()
				ss, C := l.StripeSize(), l.ChunkSize()
				stripes := int64(len(model)) / ss
				rng := newRand(44)
				write := func(off int64, wantPlaced bool) {
					t.Helper()
					p := make([]byte, 4096)
					fill(rng, p)
					mw := a.Counters().MappedBytesWritten
					ok := a.WriteCached(p, off, nil) // if not placed, perhaps cached
					if placed := ok && a.Counters().MappedBytesWritten > mw; placed != wantPlaced {
						t.Fatalf("write at %d: placed %v, want %v", off, placed, wantPlaced)
					}
					if !ok {
						if _, err := a.WriteAt(p, off); err != nil {
							t.Fatal(err)
						}
					}
					copy(model[off:], p)
				}
				// A stripe at or after s where member 1 plays role, and the data chunk written.
				find := func(s int64) (int64, int64) {
					for ; role == "parity" && l.ParityMember(s) != 1 || role == "data" && l.ParityMember(s) == 1; s++ {
					}
					d := 0
					for role == "data" && l.DataMember(s, d) != 1 {
						d++
					}
					return s, int64(d)
				}
				// The write-intent bit on disk (an ordinary write), then a placed write in
				// the first half, which finds member 1's pages there in memory.
				if _, err := a.WriteAt(model[:4096], 0); err != nil {
					t.Fatal(err)
				}
				s, d := find(1)
				write(s*ss+d*C+8192, true)
				if err := os.Truncate(paths[1], raid.DataOffset+stripes/2*C); err != nil {
					t.Fatal(err)
				}
				s, d = find(stripes/2 + 1)
				write(s*ss+d*C+8192, false)
				// Without a cache nothing else has met the short file yet. (With one, the
				// first write's write-out may have, after the truncation: then the range is no
				// longer taken to be in memory, the write is declined before the fold, and the
				// member is failed by the flush's check.)
				if m := a.Status().Members[1]; !cached && m.State != raid.MemberFaulty {
					t.Fatalf("member 1, truncated under the array: state %q after a write to its %s; want faulty", m.State, role)
				}
				compareArray(t, a, model)
				for range 200 {
					off := rng.Int64N(int64(len(model))/4096) * 4096
					p := make([]byte, 4096)
					fill(rng, p)
					if !a.WriteCached(p, off, nil) {
						if _, err := a.WriteAt(p, off); err != nil {
							t.Fatal(err)
						}
					}
					copy(model[off:], p)
				}
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				if m := a.Status().Members[1]; m.State != raid.MemberFaulty {
					t.Fatalf("member 1, truncated under the array: state %q after a flush; want faulty", m.State)
				}
				compareArray(t, a, model)
			})
		}
	}
}
