package raid_test

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/internal/looptest"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

// directLoops attaches n loop devices with direct I/O on (losetup --direct-io=on) to sparse
// files of size bytes, detached by name when the test ends; members on them are opened with
// O_DIRECT (member.DirectAuto, the default). It skips the test where loop devices cannot be
// attached (not root, no loop driver).
func directLoops(t *testing.T, n int, size int64) []string {
	t.Helper()
	if member.DirectMode() != member.DirectAuto {
		t.Fatalf("member.DirectMode() = %v, want auto", member.DirectMode())
	}
	devs, err := looptest.AttachSparse(t, n, size, looptest.Options{DirectIO: true})
	if err != nil {
		t.Skip(err)
	}
	return devs
}

// TestDirectArray runs an array on four loop devices opened with O_DIRECT, a fifth a spare:
// whole-stripe and partial writes, pinned and copied, reads, a member failed and rebuilt onto
// the spare, a scrub, the bitmap and superblock updates, close and assemble — with aligned
// requests none of it goes through a bounce buffer (every buffer the array makes that reaches
// a member is aligned), and requests at odd offsets, of odd sizes, from odd memory still read
// back every byte (bounced). A partial write the cache holds is read from the cache, not from
// the member it has not reached yet; mapped reads and writes are not used on direct members.
func TestDirectArray(t *testing.T) {
	const chunk, stripes = 16 << 10, 96
	devs := directLoops(t, 5, raid.DataOffset+stripes*chunk)
	io := raid.IOOptions{StablePages: true, MappedReads: true, MappedWrites: true, WriteBackDelay: time.Hour}
	b0 := member.Bounced()
	a, err := raid.Create(devs[:4], raid.CreateOptions{Chunk: chunk, Spares: devs[4:], IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	size := mustSize(a)
	ss := a.Layout().StripeSize()
	model := make([]byte, size)
	rng := newRand(11)

	// Aligned: whole stripes (batched) from aligned memory, partial stripes in 4 KiB units,
	// pinned and copied, then reads of every kind.
	buf := aligned.Make(int(size))
	fill(rng, buf)
	if _, err := a.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	copy(model, buf)
	for i := range 40 {
		off := 4096 * rng.Int64N(size/4096-4)
		p := aligned.Make(int(4096 * (1 + rng.Int64N(4)))) // its own: the cache may keep a reference
		fill(rng, p)
		var err error
		if i%2 == 0 {
			_, err = a.WritePinned(p, off, func() {})
		} else {
			_, err = a.WriteAt(p, off)
		}
		if err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	// The last partial write is still in the cache (an hour's write-back delay): the array
	// reads it from there; the member has not got it.
	off := 5*ss + 4096
	p := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := a.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p)
	got := aligned.Make(4096)
	if _, err := a.ReadAt(got, off); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read of a cached partial write: %v, equal %v", err, bytes.Equal(got, p))
	}
	if c := a.Counters(); c.CacheHits == 0 {
		t.Fatalf("the read of a cached stripe was not a cache hit: %+v", c)
	}
	l := a.Layout()
	dev := devs[l.DataMember(5, 0)] // off is in stripe 5's data chunk 0, 4 KiB in
	if onDisk := readDev(t, dev, raid.DataOffset+5*chunk+4096, 4096); bytes.Equal(onDisk, p) {
		t.Fatal("the member holds the cached write already: the test shows nothing")
	}
	if v, ok := a.ReadMapped(aligned.Make(1<<20), 0, nil); ok {
		a.ReleaseMapped()
		t.Fatalf("ReadMapped served %d slices from direct members", len(v))
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if onDisk := readDev(t, dev, raid.DataOffset+5*chunk+4096, 4096); !bytes.Equal(onDisk, p) {
		t.Fatal("after Flush the member does not hold the write")
	}
	compareAligned(t, a, model)

	// A member fails; the spare takes its role and is rebuilt; a scrub finds nothing.
	if err := a.Fail(devs[1]); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, a, "the rebuild onto the spare", func(st raid.Status) bool { return st.LastRebuild != nil && st.Sync == nil })
	if st.LastRebuild.Err != "" || st.LastRebuild.Done != st.LastRebuild.Total {
		t.Fatalf("rebuild: %+v", *st.LastRebuild)
	}
	compareAligned(t, a, model)
	if err := a.StartScrub(false); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, a, "the scrub", func(st raid.Status) bool { return st.LastScrub != nil && st.Sync == nil })
	if st.LastScrub.Err != "" || st.LastScrub.Mismatches != 0 {
		t.Fatalf("scrub: %+v", *st.LastScrub)
	}
	if c := a.Counters(); c.MappedBytesRead != 0 || c.MappedBytesWritten != 0 {
		t.Fatalf("%d bytes read and %d written through mappings of direct members", c.MappedBytesRead, c.MappedBytesWritten)
	}
	if n := member.Bounced() - b0; n != 0 {
		t.Fatalf("%d member calls of aligned requests, rebuild, scrub, bitmap and superblocks went through a bounce buffer: a buffer reaching a direct member is not aligned", n)
	}

	// Unaligned: odd offsets, odd sizes, odd memory; bounced, every byte read back.
	for range 60 {
		n := 1 + rng.Int64N(3*ss)
		off := rng.Int64N(size - n)
		mem := 1 + rng.Int64N(4095)
		p := buf[mem : mem+n]
		fill(rng, p)
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatalf("write of %d bytes at %d from memory +%d: %v", n, off, mem, err)
		}
		copy(model[off:], p)
		q := buf[size/2+mem : size/2+mem+n]
		if _, err := a.ReadAt(q, off); err != nil || !bytes.Equal(q, p) {
			t.Fatalf("read of %d bytes at %d into memory +%d: %v, equal %v", n, off, mem, err, bytes.Equal(q, p))
		}
	}
	compareArray(t, a, model)
	small := make([]byte, 512+1)[1:] // 512 bytes at offset 1000, into memory at an odd address
	if _, err := a.ReadAt(small, 1000); err != nil || !bytes.Equal(small, model[1000:1512]) {
		t.Fatalf("read of 512 bytes at 1000: %v, equal %v", err, bytes.Equal(small, model[1000:1512]))
	}
	if member.Bounced() == b0 {
		t.Fatal("no call went through a bounce buffer: the unaligned requests did not reach the members unaligned")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	members := []string{devs[0], devs[4], devs[2], devs[3]}
	b, err := raid.Assemble(members, raid.AssembleOptions{IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	a = b
	compareArray(t, b, model)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, members, b.Layout(), model, -1)
}

// compareAligned reads the whole array into aligned memory, then in 4 KiB-aligned pieces of
// several sizes, and compares every byte with the model.
func compareAligned(t *testing.T, a *raid.Array, model []byte) {
	t.Helper()
	got := aligned.Make(len(model))
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, model); i < len(model) {
		t.Fatalf("array differs from the model at byte %d", i)
	}
	clear(got)
	for off, i := 0, 0; off < len(got); i++ {
		n := min(4096<<(i%6), len(got)-off)
		if _, err := a.ReadAt(got[off:off+n], int64(off)); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	if i := firstDiff(got, model); i < len(model) {
		t.Fatalf("array (read in pieces) differs from the model at byte %d", i)
	}
}

// readDev reads n bytes at off of the block device dev through the page cache.
func readDev(t *testing.T, dev string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := make([]byte, n)
	if _, err := f.ReadAt(p, off); err != nil {
		t.Fatal(err)
	}
	return p
}
