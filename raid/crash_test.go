package raid_test

import (
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
	"github.com/raid5d/raid5d/stripe"
)

// fastSync lets resyncs run unthrottled in tests.
var fastSync = raid.IOOptions{SyncSpeedMin: 1 << 40, SyncSpeedMax: 1 << 40}

// inconsistent returns the stripes of members ms (read through ReadAt; the array idle or
// closed) whose parity is not the XOR of their data.
func inconsistent(t *testing.T, ms []raid.Member, l stripe.Layout) []int64 {
	t.Helper()
	C := l.ChunkSize()
	stripes := (ms[0].Size() - raid.DataOffset) / C
	P, buf := make([]byte, C), make([]byte, C)
	var bad []int64
	for s := range stripes {
		clear(P)
		off := raid.DataOffset + s*C
		for d := range l.DataMembers() {
			if _, err := ms[l.DataMember(s, d)].ReadAt(buf, off); err != nil {
				t.Fatal(err)
			}
			subtle.XORBytes(P, P, buf)
		}
		if _, err := ms[l.ParityMember(s)].ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(P, buf) {
			bad = append(bad, s)
		}
	}
	return bad
}

// corruptParity flips a byte of stripe s's parity chunk at in-chunk offset in.
func corruptParity(t *testing.T, ms []raid.Member, l stripe.Layout, s, in int64) {
	t.Helper()
	b := []byte{0}
	off := raid.DataOffset + s*l.ChunkSize() + in
	m := ms[l.ParityMember(s)]
	if _, err := m.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := m.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestResync: an array assembled dirty resyncs in the background. With a bitmap only the
// regions whose bits are set are read (counted in member bytes) and fixed — a corrupted parity
// in a region not marked stays as it is, proof that it was not touched; without one, every
// stripe is. Reads are correct throughout, Close then marks the array clean.
func TestResync(t *testing.T) {
	const C, chunks, regionStripes = 4 << 10, 64, 4
	for _, tc := range []struct {
		name   string
		region int64 // CreateOptions.BitmapRegion
	}{
		{"bitmap", regionStripes * 2 * C},
		{"no-bitmap", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mems := newMems("r", 3, raid.DataOffset+chunks*C)
			ms := asMembers(mems)
			a, err := raid.CreateMembers(ms, raid.CreateOptions{Chunk: C, BitmapRegion: tc.region})
			if err != nil {
				t.Fatal(err)
			}
			raid.StopBitmapCleaner(a) // the bits of the regions written must be on the members at the crash
			l := a.Layout()
			ss := l.StripeSize()
			want := make([]byte, chunks*ss)
			rng := rand.New(rand.NewPCG(1, 2))
			// Write stripes 5 and 6 (region 1) and 21 (region 5), partly.
			for _, s := range []int64{5, 6, 21} {
				p := make([]byte, 3*C/2)
				fill(rng, p)
				copy(want[s*ss+C/4:], p)
				if _, err := a.WriteAt(p, s*ss+C/4); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			if st := a.Status(); tc.region > 0 && (st.Bitmap == nil || st.Bitmap.Set != 2 || st.Bitmap.RegionBytes != regionStripes*ss) {
				t.Fatalf("bitmap %+v, want 2 bits set, %d bytes per bit", st.Bitmap, regionStripes*ss)
			}
			// Crash: copy the members as they are, never closed.
			crashed := cloneAll(mems, "x")
			a.Close()
			cms := asMembers(crashed)
			corruptParity(t, cms, l, 6, 100)  // region 1: marked
			corruptParity(t, cms, l, 40, 200) // region 10: not written, not marked
			var logs recorder
			b, err := raid.AssembleMembers(cms, raid.AssembleOptions{IOOptions: fastSync, Logger: slog.New(&logs)})
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(want))
			if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read during the resync: %v, equal %v", err, bytes.Equal(got, want))
			}
			p := waitResync(t, b)
			readResync := b.Counters().MemberBytesRead - uint64(len(want)) // less the read above
			wantRegions := int64(chunks / regionStripes)                   // every region
			wantFixed := int64(2)
			if tc.region > 0 {
				wantRegions, wantFixed = 2, 1
			}
			if p.Kind != "resync" || p.Err != "" || p.Total != wantRegions*regionStripes*C || p.Done != p.Total || p.Mismatches != wantFixed {
				t.Fatalf("resync %+v: want %d regions, %d stripes fixed", p, wantRegions, wantFixed)
			}
			// Every member's chunks of the regions resynced are read once: no more, no less.
			if readResync != uint64(wantRegions*regionStripes*C*3) {
				t.Fatalf("resync read %d member bytes, want %d", readResync, wantRegions*regionStripes*C*3)
			}
			if st := b.Status(); st.Unclean || st.WriteHole {
				t.Fatalf("after the resync: unclean %v, write hole %v", st.Unclean, st.WriteHole)
			}
			if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read after the resync: %v, equal %v", err, bytes.Equal(got, want))
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			for _, m := range crashed {
				m.Reopen()
			}
			bad := inconsistent(t, cms, l)
			if tc.region > 0 && !slicesEqual(bad, []int64{40}) || tc.region < 0 && len(bad) != 0 {
				t.Fatalf("inconsistent stripes after the resync: %v", bad)
			}
			if _, _, _, _, err := raid.SuperblockInfo(cms[0]); err != nil {
				t.Fatal(err)
			}
			c, err := raid.AssembleMembers(cms, raid.AssembleOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if st := c.Status(); st.Dirty || st.Unclean {
				t.Fatalf("reassembled after the resync and Close: dirty %v unclean %v", st.Dirty, st.Unclean)
			}
			c.Close()
		})
	}
}

func slicesEqual(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestResyncReconstructs: while the resync has not reached a stripe, a partial write to it
// reconstructs parity from the data instead of folding the change into its stale parity
// (read-modify-write would carry the corruption forward).
func TestResyncReconstructs(t *testing.T) {
	const C, chunks = 4 << 10, 64
	for _, mode := range []struct {
		name  string
		cache int
	}{{"cached", 0}, {"write-through", -1}} {
		t.Run(mode.name, func(t *testing.T) {
			mems := newMems("w", 4, raid.DataOffset+chunks*C)
			ms := asMembers(mems)
			a, err := raid.CreateMembers(ms, raid.CreateOptions{Chunk: C, BitmapRegion: 1})
			if err != nil {
				t.Fatal(err)
			}
			l := a.Layout()
			ss := l.StripeSize()
			crashed := crashDirty(t, a, mems, "y") // every region marked
			cms := asMembers(crashed)
			const s = chunks - 2 // the resync gets there last
			corruptParity(t, cms, l, s, 10)
			// A slow resync: 1 MB/s over 64 stripes of 12 KiB takes most of a second.
			io := raid.IOOptions{StripeCache: mode.cache, SyncSpeedMin: 1 << 20, SyncSpeedMax: 1 << 20, WriteBackDelay: time.Millisecond}
			b, err := raid.AssembleMembers(cms, raid.AssembleOptions{IOOptions: io})
			if err != nil {
				t.Fatal(err)
			}
			// One unit of one data chunk, the unit whose parity is corrupt: 1 of 3 data chunks,
			// so read-modify-write would read less and be chosen without the resync rule.
			p := bytes.Repeat([]byte{7}, 4<<10)
			if _, err := b.WriteAt(p, s*ss); err != nil {
				t.Fatal(err)
			}
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
			if st := b.Status(); st.Sync == nil || st.Sync.Kind != "resync" {
				t.Fatalf("the resync ended before the write: %+v (test too slow?)", st.Sync)
			}
			if c := b.Counters(); c.RMWWrites != 0 || c.RCWWrites != 1 {
				t.Fatalf("write to a stripe not yet resynced: %d RMW, %d RCW; want one RCW", c.RMWWrites, c.RCWWrites)
			}
			// The stripe is consistent now, before the resync got there.
			P := make([]byte, C)
			buf := make([]byte, C)
			off := int64(raid.DataOffset + s*C)
			for d := range l.DataMembers() {
				crashed[l.DataMember(s, d)].ReadAt(buf, off)
				subtle.XORBytes(P, P, buf)
			}
			crashed[l.ParityMember(s)].ReadAt(buf, off)
			if !bytes.Equal(P, buf) {
				t.Fatal("stripe written during the resync is inconsistent")
			}
			b.Close()
		})
	}
}

// TestBitmapBeforeWrite: every data-area write to a member finds its region's bit already
// durable in that member's bitmap (checked on the member's stable contents from a hook on the
// write path), a batch of whole stripes' too; the bits are cleared once the regions are idle
// and synced, and not before.
func TestBitmapBeforeWrite(t *testing.T) {
	const C, chunks = 4 << 10, 64
	vs := make([]*raidtest.Volatile, 4)
	fs := make([]*raidtest.Faulty, 4)
	ms := make([]raid.Member, 4)
	for i := range vs {
		vs[i] = raidtest.NewVolatile(fmt.Sprintf("v%d", i), raid.DataOffset+chunks*C)
		fs[i] = raidtest.NewFaulty(vs[i])
		ms[i] = fs[i]
	}
	a, err := raid.CreateMembers(ms, raid.CreateOptions{Chunk: C, BitmapRegion: 2 * 3 * C})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	raid.StopBitmapCleaner(a) // the test clears the bits itself (CleanBitmap), when it says
	const regionStripes = 2
	if st := a.Status(); st.Bitmap == nil || st.Bitmap.Regions != chunks/regionStripes {
		t.Fatalf("bitmap %+v, want %d regions", st.Bitmap, chunks/regionStripes)
	}
	stableBit := func(v *raidtest.Volatile, r int64) bool {
		b := []byte{0}
		v.Stable(b, raid.BitmapOffset+r/8)
		return b[0]&(1<<(r%8)) != 0
	}
	var checked, missing atomic.Int64
	for i, f := range fs {
		f.SetHook(func(op raidtest.Op, off int64) {
			if op != raidtest.OpWrite || off < raid.DataOffset {
				return
			}
			checked.Add(1)
			if !stableBit(vs[i], (off-raid.DataOffset)/C/regionStripes) {
				missing.Add(1)
			}
		})
	}
	ss := a.Layout().StripeSize()
	// First 8 whole stripes at once: one batch of vectored member writes (stripe.MemberOp
	// spanning Stripes stripes), whose every region's bit must be durable, not just the first's.
	batch := make([]byte, 8*ss)
	fill(rng2(9, 9), batch)
	if _, err := a.WriteAt(batch, 2*ss); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			buf := make([]byte, 4<<10)
			for i := range 50 {
				fill(rng2(g, i), buf)
				off := int64((g*50+i)*7919%int(chunks*ss/(4<<10))) * (4 << 10)
				if _, err := a.WriteAt(buf, off); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if checked.Load() == 0 || missing.Load() != 0 {
		t.Fatalf("%d of %d member writes found their region's bit not yet durable", missing.Load(), checked.Load())
	}
	st := a.Status()
	if st.Bitmap.Set == 0 || st.Bitmap.Flushes == 0 || st.Bitmap.Flushes > uint64(st.Bitmap.Set)+1 {
		t.Fatalf("bitmap %+v: want bits set, at most one flush per bit", st.Bitmap)
	}
	// Not idle long enough: nothing cleared.
	raid.CleanBitmap(a, time.Hour)
	if st := a.Status(); st.Bitmap.Set == 0 {
		t.Fatal("bits cleared before the regions were idle")
	}
	raid.CleanBitmap(a, 0)
	if st := a.Status(); st.Bitmap.Set != 0 {
		t.Fatalf("%d bits still set after the regions went idle", st.Bitmap.Set)
	}
	for r := range int64(chunks / regionStripes) {
		for i, v := range vs {
			if stableBit(v, r) {
				t.Fatalf("member %d: bit %d still set on disk", i, r)
			}
		}
	}
}

func rng2(g, i int) *rand.Rand { return rand.New(rand.NewPCG(uint64(g), uint64(i))) }

// createBitmapFiles creates an array of 3 member files with one bitmap bit per stripe
// (BitmapRegion 1) and no stripe cache, and returns it with the members' paths.
func createBitmapFiles(t *testing.T) (*raid.Array, []string) {
	t.Helper()
	paths := memberPaths(t.TempDir(), 3)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize, BitmapRegion: 1,
		IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	return a, paths
}

// TestBitmapFiles: the bitmap on real member files — the superblock says so, bits are set in
// the files before a write returns and cleared on a clean Close; an array created without a
// bitmap (as before it existed) assembles and has none.
func TestBitmapFiles(t *testing.T) {
	a, paths := createBitmapFiles(t)
	ss := a.Layout().StripeSize()
	if _, err := a.WriteAt([]byte("hello"), 3*ss+10); err != nil { // stripe 3: bit 3
		t.Fatal(err)
	}
	bitmapByte := func(path string) byte {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b[raid.BitmapOffset]
	}
	for _, p := range paths {
		if got := bitmapByte(p); got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after a write to stripe 3", p, got)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if got := bitmapByte(p); got != 0 {
			t.Fatalf("%s: bitmap byte %08b after Close", p, got)
		}
	}
	b, err := raid.Assemble(paths, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := b.Status(); st.Bitmap == nil || st.Bitmap.Regions != 16 {
		t.Fatalf("reassembled: bitmap %+v", st.Bitmap)
	}
	b.Close()

	old := memberPaths(t.TempDir(), 3)
	c, err := raid.Create(old, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize, BitmapRegion: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt([]byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.Bitmap != nil {
		t.Fatalf("created without a bitmap: %+v", st.Bitmap)
	}
	c.Close()
	d, err := raid.Assemble(old, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := d.Status(); st.Bitmap != nil || st.Dirty {
		t.Fatalf("reassembled without a bitmap: %+v, dirty %v", st.Bitmap, st.Dirty)
	}
	d.Close()
}

// Blocks of the power-cut test: 4 KiB, headed by offset, generation and a CRC of the rest;
// the body is generated from (offset, generation).
const blk = 4 << 10

func makeBlock(b []byte, off int64, gen uint64) {
	rng := rand.New(rand.NewPCG(uint64(off), gen))
	for i := 16; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	binary.LittleEndian.PutUint64(b[0:], uint64(off))
	binary.LittleEndian.PutUint32(b[8:], uint32(gen))
	binary.LittleEndian.PutUint32(b[12:], crc32.ChecksumIEEE(b[16:]))
}

// blockGen returns the generation a block holds: 0 for zeroes (never written), -1 if it is
// neither zeroes nor a whole block written for offset off (torn, or from elsewhere).
func blockGen(b []byte, off int64) int64 {
	if bytes.Count(b, []byte{0}) == len(b) {
		return 0
	}
	if int64(binary.LittleEndian.Uint64(b)) != off || binary.LittleEndian.Uint32(b[12:]) != crc32.ChecksumIEEE(b[16:]) {
		return -1
	}
	gen := binary.LittleEndian.Uint32(b[8:])
	want := make([]byte, len(b))
	makeBlock(want, off, uint64(gen))
	if !bytes.Equal(want, b) {
		return -1
	}
	return int64(gen)
}

// powerCutLoad is the power-cut tests' workload. Writers goroutines write to a: writer g the
// blocks blocks[k] with k%writers == g, at random, each a new generation (makeBlock; issued
// counts them), flushing every flushEvery writes (durable records the generations each flush
// made durable); seed picks the writers' random streams. Once every writer could have
// flushed twice (or after 10 s) and a random pause of up to maxPause, the power goes on cut
// (PowerCut: unsynced pages kept with probability keep, chosen by rng), and the writers stop.
type powerCutLoad struct {
	writers, flushEvery int
	seed                uint64
	maxPause            time.Duration
	keep                float64
	rng                 *rand.Rand
}

// run runs the workload on a and returns, per block index, the generation last flushed and
// the last issued (maybe not acknowledged), and the pages the cut kept and lost.
func (l powerCutLoad) run(a *raid.Array, blocks []int64, durable, issued []int64, cut ...*raidtest.Volatile) (kept, lost int) {
	var stop atomic.Bool
	var flushes atomic.Int64
	var wg sync.WaitGroup
	for g := range l.writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), l.seed))
			p := make([]byte, blk)
			acked := map[int64]int64{}
			for i := 0; !stop.Load() && i < 5000; i++ {
				b := blocks[rng.IntN(len(blocks)/l.writers)*l.writers+g]
				issued[b]++
				makeBlock(p, b*blk, uint64(issued[b]))
				if _, err := a.WriteAt(p, b*blk); err != nil {
					return // the cut
				}
				acked[b] = issued[b]
				if i%l.flushEvery == l.flushEvery-1 {
					if a.Flush() != nil {
						return
					}
					for x, gen := range acked {
						durable[x] = gen
					}
					clear(acked)
					flushes.Add(1)
				}
			}
		})
	}
	// Cut at a random moment after every writer could have flushed a few times.
	for deadline := time.Now().Add(10 * time.Second); flushes.Load() < 2*int64(l.writers) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(time.Duration(rand.Int64N(int64(l.maxPause))))
	kept, lost = raidtest.PowerCut(l.keep, l.rng, cut...)
	stop.Store(true)
	wg.Wait()
	return kept, lost
}

// TestPowerCut crashes the whole machine in-process: writers write blocks, each flushing now
// and then, while every member is cut off at a random moment, losing its unsynced pages (all
// of them, or a random subset as a reordering disk would). Reassembled, every block flushed
// before the cut holds its flushed generation or a later one written, every other block one
// of the generations written to it (never a mix, never garbage); the resync runs (only over
// the regions written, with the bitmap) and leaves every stripe's parity consistent. With the
// journal (its device cut at the same instant) the journal is replayed instead: no resync, and
// every stripe's parity is consistent right after assembly.
func TestPowerCut(t *testing.T) {
	const C, chunks, members, writers = 4 << 10, 256, 4, 4
	const stripe = (members - 1) * C // the bitmap's region: one stripe, so the resync's extent shows
	for _, tc := range []struct {
		name    string
		region  int64
		keep    float64
		cache   int
		journal bool
	}{
		{"bitmap/lose-all", stripe, 0, 0, false},
		{"bitmap/reorder", stripe, 0.5, 0, false},
		{"bitmap/write-through/reorder", stripe, 0.5, -1, false},
		{"no-bitmap/reorder", -1, 0.5, 0, false},
		{"journal/lose-all", 0, 0, 0, true},
		{"journal/reorder", 0, 0.5, 0, true},
		{"journal/write-through/lose-all", 0, 0, -1, true},
		{"journal/write-through/reorder", 0, 0.5, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, ms := newVolatiles("p", members, raid.DataOffset+chunks*C)
			opts := raid.CreateOptions{Chunk: C, BitmapRegion: tc.region,
				IOOptions: raid.IOOptions{StripeCache: tc.cache, WriteBackDelay: time.Millisecond}}
			all := vs // what the power cut cuts
			var jv *raidtest.Volatile
			if tc.journal {
				jv = raidtest.NewVolatile("/nonexistent/p-journal", 2<<20) // small: it wraps
				opts.Consistency, opts.Journal = raid.ConsistencyJournal, jv
				all = append(vs[:len(vs):len(vs)], jv)
			}
			a, err := raid.CreateMembers(ms, opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Flush(); err != nil { // Create's zeroing is volatile too
				t.Fatal(err)
			}
			// Writers use the first quarter of the array; writer g owns blocks b with b%writers == g.
			nblk := mustSize(a) / 4 / blk
			durable := make([]int64, nblk) // generation flushed
			issued := make([]int64, nblk)  // last generation issued (maybe not acknowledged)
			blocks := make([]int64, nblk)
			for i := range blocks {
				blocks[i] = int64(i)
			}
			load := powerCutLoad{writers: writers, flushEvery: 16, seed: 99, maxPause: 100 * time.Millisecond,
				keep: tc.keep, rng: rand.New(rand.NewPCG(7, uint64(len(tc.name))))}
			kept, lost := load.run(a, blocks, durable, issued, all...)
			t.Logf("power cut: %d unsynced pages kept, %d lost", kept, lost)
			a.Close() // fails: the members are off
			for _, v := range all {
				v.Reopen()
			}
			b, err := raid.AssembleMembers(ms, raid.AssembleOptions{IOOptions: fastSync, Journal: jv})
			if err != nil {
				t.Fatal(err)
			}
			// Unclean until the resync ends, which a resync of a few regions may already have.
			if st := b.Status(); !st.Unclean && st.LastResync == nil && !tc.journal {
				t.Fatal("assembled after a power cut: not unclean, and no resync ran")
			}
			if tc.journal {
				// Replayed: consistent without a resync. Check the members before anything else.
				st := b.Status()
				// (Nothing to replay is possible: the cut may find the journal just checkpointed.)
				if st.Unclean || st.Sync != nil || st.Journal == nil {
					t.Fatalf("journal: unclean %v, sync %+v, %+v", st.Unclean, st.Sync, st.Journal)
				}
				if bad := inconsistent(t, ms, b.Layout()); len(bad) != 0 {
					t.Fatalf("stripes with inconsistent parity after the replay: %v", bad)
				}
				t.Logf("replayed %d records", st.Journal.Replayed)
			}
			check := func(when string) {
				buf := make([]byte, nblk*blk)
				if _, err := b.ReadAt(buf, 0); err != nil {
					t.Fatal(err)
				}
				flushed := 0
				for i := range nblk {
					gen := blockGen(buf[i*blk:(i+1)*blk], i*blk)
					if gen < durable[i] || gen > issued[i] {
						t.Fatalf("%s: block %d holds generation %d; flushed %d, last written %d", when, i, gen, durable[i], issued[i])
					}
					if durable[i] > 0 {
						flushed++
					}
				}
				if flushed == 0 {
					t.Fatalf("%s: no block was flushed before the cut", when)
				}
			}
			check("during the resync")
			if tc.journal {
				check("after the replay")
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			p := waitResync(t, b)
			check("after the resync")
			if p.Err != "" || p.Done != p.Total {
				t.Fatalf("resync: %+v", p)
			}
			if tc.region >= 0 && p.Total > int64(chunks*C/2) {
				t.Fatalf("resync with the bitmap covered %d of %d bytes per member; writes touched a quarter", p.Total, chunks*C)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			for _, v := range vs {
				v.Reopen()
			}
			if bad := inconsistent(t, ms, b.Layout()); len(bad) != 0 {
				t.Fatalf("stripes with inconsistent parity after the resync: %v", bad)
			}
			t.Logf("resync: %d of %d bytes per member, %d stripes fixed", p.Total, chunks*C, p.Mismatches)
		})
	}
}

// newVolatiles returns n volatile members of size bytes named prefix0, prefix1..., also as
// raid.Members.
func newVolatiles(prefix string, n int, size int64) ([]*raidtest.Volatile, []raid.Member) {
	vs := make([]*raidtest.Volatile, n)
	ms := make([]raid.Member, n)
	for i := range vs {
		vs[i] = raidtest.NewVolatile(fmt.Sprintf("%s%d", prefix, i), size)
		ms[i] = vs[i]
	}
	return vs, ms
}

// writeD0D1 writes stripe s's first data chunk with 0xd0 bytes and its second with d1.
func writeD0D1(t *testing.T, a *raid.Array, s int64, d1 []byte) {
	t.Helper()
	l := a.Layout()
	if _, err := a.WriteAt(bytes.Repeat([]byte{0xd0}, len(d1)), s*l.StripeSize()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt(d1, s*l.StripeSize()+int64(len(d1))); err != nil {
		t.Fatal(err)
	}
}

// crashDirty writes zeroes over all of a (marking every bitmap region), flushes, and returns
// copies of its members mems as a crash would leave them (named prefix0...); then closes a.
func crashDirty(t *testing.T, a *raid.Array, mems []*raidtest.Mem, prefix string) []*raidtest.Mem {
	t.Helper()
	if err := a.WriteZeroes(0, mustSize(a), true); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	crashed := cloneAll(mems, prefix)
	a.Close()
	return crashed
}

// TestWriteHole shows what the bitmap does not cover. A degraded array (one member gone) is
// cut off in the middle of a read-modify-write: the new data chunk reached its disk, the new
// parity did not. Reassembly is refused (ErrDirtyDegraded); forced, the stripe cannot be
// resynced (its parity is needed to rebuild the missing chunk), Status says so, and the missing member's chunk — which no one
// wrote — now reads wrong. A consistency policy that logs partial parity (PPL) or journals
// writes closes this hole; the bitmap alone cannot.
func TestWriteHole(t *testing.T) {
	const C, chunks = 4 << 10, 16
	vs, ms := newVolatiles("h", 3, raid.DataOffset+chunks*C)
	a, err := raid.CreateMembers(ms, raid.CreateOptions{Chunk: C, IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	l := a.Layout()
	const s = 1
	d0, pm := l.DataMember(s, 0), l.ParityMember(s)
	orig := bytes.Repeat([]byte{0xd1}, C)
	writeD0D1(t, a, s, orig) // D1: never written again
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	for _, v := range vs {
		v.Reopen()
	}
	// Degraded: D1's member is gone.
	deg := []raid.Member{ms[d0], ms[pm]}
	b, err := raid.AssembleMembers(deg, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, C)
	if _, err := b.ReadAt(got, s*l.StripeSize()+C); err != nil || !bytes.Equal(got, orig) {
		t.Fatalf("degraded read of D1 before the crash: %v, equal %v", err, bytes.Equal(got, orig))
	}
	// A write to D0 only: read-modify-write of D0 and P. Then D0's member syncs (its disk
	// wrote the new chunk), and the power goes before P's does.
	if _, err := b.WriteAt(bytes.Repeat([]byte{0xee}, C), s*l.StripeSize()); err != nil {
		t.Fatal(err)
	}
	if err := vs[d0].Sync(); err != nil {
		t.Fatal(err)
	}
	raidtest.PowerCut(0, nil, vs...)
	b.Close()
	for _, v := range vs {
		v.Reopen()
	}
	// Refused (ErrDirtyDegraded), as md refuses a dirty degraded array; Force runs it.
	var dd *raid.DirtyDegradedError
	if _, err := raid.AssembleMembers(deg, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}}); !errors.As(err, &dd) || !dd.FailedBefore {
		t.Fatalf("dirty and degraded (role failed before the crash), without Force: %v", err)
	}
	var logs recorder
	c, err := raid.AssembleMembers(deg, raid.AssembleOptions{Force: true, Logger: slog.New(&logs), IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st := c.Status(); !st.WriteHole || !st.Unclean || logs.count(slog.LevelError) == 0 {
		t.Fatalf("dirty and degraded: write hole %v, unclean %v, %d errors logged", st.WriteHole, st.Unclean, logs.count(slog.LevelError))
	}
	if _, err := c.ReadAt(got, s*l.StripeSize()+C); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, orig) {
		t.Fatal("D1 survived: the test did not hit the write hole")
	}
	// D1 now reads as new D0 ^ old P: garbage nobody wrote.
	want := make([]byte, C)
	subtle.XORBytes(want, bytes.Repeat([]byte{0xee}, C), bytes.Repeat([]byte{0xd0 ^ 0xd1}, C))
	if !bytes.Equal(got, want) {
		t.Fatalf("D1 reads %x..., want the write hole's %x...", got[:4], want[:4])
	}

}

// TestWriteHoleJournal is TestWriteHole with the journal policy: the same crash — new D0 on
// its disk, new parity lost — and the journal's replay rewrites both, so D1, which nobody
// wrote, reads as it did; D0 holds its new contents (the write was logged); no write hole is
// reported and no resync runs.
func TestWriteHoleJournal(t *testing.T) {
	const C, chunks = 4 << 10, 16
	vs, ms := newVolatiles("hj", 3, raid.DataOffset+chunks*C)
	jv := raidtest.NewVolatile("/nonexistent/hj-journal", raid.MinJournalSize)
	io := raid.IOOptions{StripeCache: -1}
	a, err := raid.CreateMembers(ms, raid.CreateOptions{Chunk: C, Consistency: raid.ConsistencyJournal, Journal: jv, IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	l := a.Layout()
	const s = 1
	d0, pm := l.DataMember(s, 0), l.ParityMember(s)
	orig := bytes.Repeat([]byte{0xd1}, C)
	writeD0D1(t, a, s, orig)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	deg := []raid.Member{ms[d0], ms[pm]}
	b, err := raid.AssembleMembers(deg, raid.AssembleOptions{Journal: jv, IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	newD0 := bytes.Repeat([]byte{0xee}, C)
	if _, err := b.WriteAt(newD0, s*l.StripeSize()); err != nil {
		t.Fatal(err)
	}
	if err := vs[d0].Sync(); err != nil {
		t.Fatal(err)
	}
	raidtest.PowerCut(0, nil, append(vs, jv)...)
	b.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	// The crash left the hole on the members: D0 new, P old.
	P := make([]byte, C)
	vs[pm].ReadAt(P, raid.DataOffset+s*C)
	if !bytes.Equal(P, bytes.Repeat([]byte{0xd0 ^ 0xd1}, C)) {
		t.Fatal("the new parity reached its member: the test did not make the hole")
	}
	var logs recorder
	c, err := raid.AssembleMembers(deg, raid.AssembleOptions{Journal: jv, Logger: slog.New(&logs), IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st := c.Status(); st.WriteHole || st.Unclean || st.Sync != nil || logs.count(slog.LevelError) != 0 || st.Journal.Replayed != 1 {
		t.Fatalf("write hole %v, unclean %v, sync %+v, %d errors, journal %+v", st.WriteHole, st.Unclean, st.Sync, logs.count(slog.LevelError), st.Journal)
	}
	got := make([]byte, 2*C)
	if _, err := c.ReadAt(got, s*l.StripeSize()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[C:], orig) {
		t.Fatalf("D1 reads %x..., want %x...: the journal did not close the hole", got[C:C+4], orig[:4])
	}
	if !bytes.Equal(got[:C], newD0) {
		t.Fatalf("D0 reads %x..., want the logged write's %x...", got[:4], newD0[:4])
	}
}

// TestScrubDuringResync: a scrub started while the resync runs waits for it (not ErrBusy) and
// shows as the scrub; StopScrub stops the scrub at once and leaves the resync running; the
// resync cannot be stopped as a scrub; Close stops both.
func TestScrubDuringResync(t *testing.T) {
	const C, chunks = 4 << 10, 64
	mems := newMems("s", 3, raid.DataOffset+chunks*C)
	a, err := raid.CreateMembers(asMembers(mems), raid.CreateOptions{Chunk: C, BitmapRegion: 1})
	if err != nil {
		t.Fatal(err)
	}
	crashed := crashDirty(t, a, mems, "s")
	// 256 KiB per member at 64 KiB/s: about four seconds of resync.
	slow := raid.IOOptions{SyncSpeedMin: 64 << 10, SyncSpeedMax: 64 << 10}
	b, err := raid.AssembleMembers(asMembers(crashed), raid.AssembleOptions{IOOptions: slow})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.StopScrub(); !errors.Is(err, raid.ErrNotRunning) {
		t.Fatalf("StopScrub during the resync: %v, want ErrNotRunning", err)
	}
	if err := b.StartScrub(false); err != nil {
		t.Fatalf("StartScrub during the resync: %v", err)
	}
	if st := b.Status(); st.Sync == nil || st.Sync.Kind != "check" {
		t.Fatalf("a waiting scrub shows as %+v, want check", st.Sync)
	}
	start := time.Now()
	if err := b.StopScrub(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("StopScrub of a waiting scrub took %v", d)
	}
	if st := b.Status(); st.Sync == nil || st.Sync.Kind != "resync" {
		t.Fatalf("after the scrub stopped: %+v, want the resync still running", st.Sync)
	}
	if err := b.StartScrub(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if st := b.Status(); st.Sync == nil || st.Sync.Kind != "check" || st.Sync.Done != 0 || st.LastResync != nil {
		t.Fatalf("a second scrub must wait for the resync: %+v, last resync %+v", st.Sync, st.LastResync)
	}
	start = time.Now()
	b.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close with a resync and a waiting scrub took %v", d)
	}
}

// TestConsistencyOption: "bitmap" (and "") give a bitmap, "none" none, "journal" with a
// journal a journal and no bitmap; "ppl", "journal" without a journal, a journal too small
// and unknown policies are refused before any member is touched.
func TestConsistencyOption(t *testing.T) {
	for _, tc := range []struct {
		name, policy string
		journal      int64 // journal size, 0 none
		bitmap       bool
		err          error
	}{
		{"default", "", 0, true, nil}, {"bitmap", raid.ConsistencyBitmap, 0, true, nil}, {"none", raid.ConsistencyNone, 0, false, nil},
		{"journal", raid.ConsistencyJournal, raid.MinJournalSize, false, nil},
		{"ppl", "ppl", 0, false, raid.ErrConsistency}, {"journal-without", "journal", 0, false, raid.ErrConsistency},
		{"journal-small", "journal", raid.MinJournalSize - 4096, false, raid.ErrJournal},
		{"paranoid", "paranoid", 0, false, raid.ErrConsistency},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := newMems("k", 3, memberSize)
			opts := raid.CreateOptions{Chunk: testChunk, Consistency: tc.policy}
			if tc.journal > 0 {
				opts.Journal = raidtest.NewMem("/nonexistent/k-journal", tc.journal)
			}
			a, err := raid.CreateMembers(asMembers(ms), opts)
			if !errors.Is(err, tc.err) {
				t.Fatalf("Create: %v, want %v", err, tc.err)
			}
			if err != nil {
				ms[0].Bytes()[raid.DataOffset] = 1 // a Create that went ahead would zero it
				if _, err := raid.CreateMembers(asMembers(ms), opts); !errors.Is(err, tc.err) || ms[0].Bytes()[raid.DataOffset] != 1 {
					t.Fatalf("a refused Create touched a member (or was not refused: %v)", err)
				}
				return
			}
			defer a.Close()
			st := a.Status()
			if got := st.Bitmap != nil; got != tc.bitmap {
				t.Fatalf("bitmap %v, want %v", got, tc.bitmap)
			}
			want := tc.policy
			if want == "" {
				want = raid.ConsistencyBitmap
			}
			if st.Consistency != want || (st.Journal != nil) != (tc.journal > 0) {
				t.Fatalf("policy %q, journal %+v", st.Consistency, st.Journal)
			}
		})
	}
}
