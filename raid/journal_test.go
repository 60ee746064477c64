package raid_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member/faulty"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// journaled makes n Volatile members and a Volatile journal of jsize bytes and creates an
// array with the journal policy on them.
func journaled(t *testing.T, prefix string, n int, memberBytes, jsize int64, io raid.IOOptions) (*raid.Array, []*raidtest.Volatile, *raidtest.Volatile) {
	t.Helper()
	vs := make([]*raidtest.Volatile, n)
	for i := range vs {
		vs[i] = raidtest.NewVolatile(fmt.Sprintf("%s%d", prefix, i), memberBytes)
	}
	jv := raidtest.NewVolatile("/nonexistent/"+prefix+"-journal", jsize)
	a, err := raid.CreateMembers(asMembers(vs), raid.CreateOptions{Chunk: 4 << 10, Consistency: raid.ConsistencyJournal,
		Journal: jv, IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil { // Create's zeroing is volatile too
		t.Fatal(err)
	}
	return a, vs, jv
}

// recordAt decodes the record at logical position lsn of the journal on jv (stable contents).
func recordAt(jv *raidtest.Volatile, ring int64, lsn uint64) (seq uint64, err error) {
	b := make([]byte, 64<<10)
	jv.Stable(b, raid.JournalRingOffset+int64(lsn%uint64(ring)))
	seq, err = raid.JournalRecordSeq(b)
	if err != nil {
		// The decoder wants exactly the record: retry with the length it states.
		for n := 4096; n <= len(b); n += 4096 {
			if seq, err = raid.JournalRecordSeq(b[:n]); err == nil {
				break
			}
		}
	}
	return seq, err
}

// TestJournalWrap: many concurrent writers (cache on) through a small journal: the ring wraps
// many times, checkpoints reclaim it, nobody deadlocks. Then the power goes: the records since
// the last checkpoint are replayed and the one after them — a whole record from the previous
// lap, checksums right — is not. Every block holds the last generation written to it (each
// write was flushed), and every stripe's parity matches.
func TestJournalWrap(t *testing.T) {
	const members, chunks, writers = 4, 256, 4
	// A ring of 255 pages holds exactly 85 records of three pages (a 4 KiB write: header,
	// data, parity), so every lap starts at the same place: the stale records line up.
	a, vs, jv := journaled(t, "w", members, raid.DataOffset+chunks*4096, 2*4096+255*4096,
		raid.IOOptions{StripeCache: -1})
	nblk := mustSize(a) / blk
	last := make([]int64, nblk)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 5))
			buf := make([]byte, blk)
			for i := range 400 {
				b := int64(rng.IntN(int(nblk/writers)))*writers + int64(g)
				gen := int64(i + 1)
				makeBlock(buf, b*blk, uint64(gen))
				if _, err := a.WriteAt(buf, b*blk); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				last[b] = gen
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// The last writes may have kicked the checkpointer: stop it, so that the tail read here
	// is the one the power cut leaves in the journal's header.
	raid.StopJournalCheckpointer(a)
	st := a.Status()
	head, tail, seq, ring, _ := raid.JournalPosition(a)
	t.Logf("journal: %+v; head %d tail %d", *st.Journal, head, tail)
	if st.Journal.Checkpoints < 5 || head < 10*uint64(ring) {
		t.Fatalf("the ring did not wrap many times: %+v, head %d, ring %d", *st.Journal, head, ring)
	}
	raidtest.PowerCut(0, nil, append(vs, jv)...)
	a.Close()
	for _, v := range append(vs, jv) {
		v.Reopen()
	}
	// At the head lies a whole record of the previous lap, 85 numbers behind.
	if s, err := recordAt(jv, ring, head); err != nil || s+85 != seq {
		t.Fatalf("at the head: record %d (%v); want a stale record %d", s, err, seq-85)
	}
	b, err := raid.AssembleMembers(asMembers(vs), raid.AssembleOptions{Journal: jv})
	if err != nil {
		t.Fatal(err)
	}
	want := int((head - tail) / (3 * 4096))
	if st := b.Status(); st.Journal.Replayed != want || st.Unclean || st.Sync != nil {
		t.Fatalf("replayed %d records, want %d (unclean %v, sync %+v)", st.Journal.Replayed, want, st.Unclean, st.Sync)
	}
	buf := make([]byte, nblk*blk)
	if _, err := b.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	for i := range nblk {
		if g := blockGen(buf[i*blk:(i+1)*blk], i*blk); g != last[i] {
			t.Fatalf("block %d holds generation %d, last written %d", i, g, last[i])
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		v.Reopen()
	}
	if bad := inconsistent(t, asMembers(vs), b.Layout()); len(bad) != 0 {
		t.Fatalf("inconsistent stripes: %v", bad)
	}
}

// TestJournalDegradedPowerCut is TestWriteHole with the journal, under load: a degraded array
// whose chunks all hold known blocks is written (some chunks only) by concurrent writers with
// flushes, and the power goes mid-write (unsynced pages lost or kept at random). Reassembled
// degraded, every chunk that was not being written — the missing member's included, read
// through parity — holds exactly what it held; every written block its flushed generation or
// a later one written; and no resync is needed or run.
func TestJournalDegradedPowerCut(t *testing.T) {
	const members, chunks, writers, C = 4, 64, 4, 4 << 10
	for _, tc := range []struct {
		name  string
		keep  float64
		cache int
	}{{"cached/reorder", 0.5, 0}, {"write-through/lose-all", 0, -1}, {"write-through/reorder", 0.5, -1}} {
		t.Run(tc.name, func(t *testing.T) {
			io := raid.IOOptions{StripeCache: tc.cache, WriteBackDelay: time.Millisecond}
			a, vs, jv := journaled(t, "d", members, raid.DataOffset+chunks*C, 4<<20, io)
			size := mustSize(a)
			nblk := size / blk
			buf := make([]byte, size)
			for i := range nblk {
				makeBlock(buf[i*blk:(i+1)*blk], i*blk, 1)
			}
			if _, err := a.WriteAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			for _, v := range append(vs, jv) {
				v.Reopen()
			}
			deg := asMembers(vs[1:]) // role 0 is gone
			b, err := raid.AssembleMembers(deg, raid.AssembleOptions{Journal: jv, IOOptions: io})
			if err != nil {
				t.Fatal(err)
			}
			// Array chunk k is written only if k%3 == 0; a chunk is one block here.
			written := func(blkIdx int64) bool { return blkIdx%3 == 0 }
			var wblocks []int64
			for i := range nblk {
				if written(i) {
					wblocks = append(wblocks, i)
				}
			}
			durable := make([]int64, nblk)
			issued := make([]int64, nblk)
			for i := range durable {
				durable[i], issued[i] = 1, 1
			}
			load := powerCutLoad{writers: writers, flushEvery: 8, seed: 17, maxPause: 50 * time.Millisecond,
				keep: tc.keep, rng: rand.New(rand.NewPCG(11, uint64(len(tc.name))))}
			kept, lost := load.run(b, wblocks, durable, issued, append(vs, jv)...)
			b.Close()
			t.Logf("power cut: %d unsynced pages kept, %d lost", kept, lost)
			for _, v := range append(vs, jv) {
				v.Reopen()
			}
			var logs recorder
			c, err := raid.AssembleMembers(deg, raid.AssembleOptions{Journal: jv, Logger: slog.New(&logs), IOOptions: io})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st := c.Status()
			if st.WriteHole || st.Unclean || st.Sync != nil || st.Journal == nil || logs.count(slog.LevelError) != 0 {
				t.Fatalf("after the replay: write hole %v, unclean %v, sync %+v, journal %+v, %d errors logged",
					st.WriteHole, st.Unclean, st.Sync, st.Journal, logs.count(slog.LevelError))
			}
			t.Logf("replayed %d records", st.Journal.Replayed)
			got := make([]byte, size)
			if _, err := c.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			for i := range nblk {
				blkBytes := got[i*blk : (i+1)*blk]
				if !written(i) {
					if !bytes.Equal(blkBytes, buf[i*blk:(i+1)*blk]) {
						t.Fatalf("chunk %d (member %d), never written, changed: generation %d", i,
							c.Layout().DataMember(i*blk/c.Layout().StripeSize(), int(i%3)), blockGen(blkBytes, i*blk))
					}
					continue
				}
				if g := blockGen(blkBytes, i*blk); g < durable[i] || g > issued[i] {
					t.Fatalf("block %d holds generation %d; flushed %d, last written %d", i, g, durable[i], issued[i])
				}
			}
		})
	}
}

// TestJournalRefusals: an array with the journal policy that was not shut down cleanly is
// not assembled without its journal (ErrJournalMissing, naming it), nor with another array's
// journal or a journal whose header is corrupt (ErrJournal); nothing is written to any member
// or journal meanwhile. Shut down cleanly, it assembles without the journal, read-only.
func TestJournalRefusals(t *testing.T) {
	mk := func(prefix string) ([]*raidtest.Mem, *raidtest.Mem, *raid.Array) {
		ms := newMems(prefix, 3, memberSize)
		jm := raidtest.NewMem("/nonexistent/"+prefix+"-journal", raid.MinJournalSize)
		a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk, Consistency: raid.ConsistencyJournal, Journal: jm})
		if err != nil {
			t.Fatal(err)
		}
		return ms, jm, a
	}
	ms, jm, a := mk("r")
	if _, err := a.WriteAt(bytes.Repeat([]byte{7}, 6000), 1000); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	crashed := cloneAll(ms, "rx")
	cj := clone(jm, jm.Name())
	a.Close()
	_, other, b := mk("o")
	b.Close()
	other.Reopen()
	snapshot := func() [][]byte {
		var s [][]byte
		for _, m := range append(crashed, cj) {
			s = append(s, bytes.Clone(m.Bytes()))
		}
		return s
	}
	before := snapshot()
	corrupt := clone(cj, "corrupt")
	corrupt.Bytes()[100] ^= 1
	corrupt.Bytes()[4096+100] ^= 1
	for _, tc := range []struct {
		name string
		opts raid.AssembleOptions
		want error
		say  string
	}{
		{"missing", raid.AssembleOptions{}, raid.ErrJournalMissing, "/nonexistent/r-journal"},
		{"missing path", raid.AssembleOptions{JournalPath: filepath.Join(t.TempDir(), "gone")}, raid.ErrJournalMissing, "gone"},
		{"foreign", raid.AssembleOptions{Journal: other}, raid.ErrJournal, "journal of array"},
		{"corrupt", raid.AssembleOptions{Journal: corrupt}, raid.ErrJournal, "checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := raid.AssembleMembers(asMembers(crashed), tc.opts)
			if !errors.Is(err, tc.want) || err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.say)) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("Assemble: %v, want %v saying %q", err, tc.want, tc.say)
			}
			for i, s := range snapshot() {
				if !bytes.Equal(s, before[i]) {
					t.Fatalf("a refused assembly wrote to member %d", i)
				}
			}
		})
	}
	// The right journal: replayed, then Close leaves it clean; without it now: read-only.
	c, err := raid.AssembleMembers(asMembers(crashed), raid.AssembleOptions{Journal: cj})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 6000)
	if _, err := c.ReadAt(got, 1000); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{7}, 6000)) {
		t.Fatalf("after the replay: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range crashed {
		m.Reopen()
	}
	d, err := raid.AssembleMembers(asMembers(crashed), raid.AssembleOptions{})
	if err != nil {
		t.Fatalf("clean, journal missing: %v", err)
	}
	defer d.Close()
	if st := d.Status(); st.Consistency != raid.ConsistencyJournal || st.Journal == nil || !st.Journal.Missing {
		t.Fatalf("status %q %+v", st.Consistency, st.Journal)
	}
	if _, err := d.WriteAt([]byte{1}, 0); err == nil {
		t.Fatal("wrote to an array assembled without its journal")
	}
}

// TestJournalFiles: the journal policy on real files, as the command line uses it: Create
// makes the journal file (relative path), the superblocks record its absolute path, Assemble
// finds it there or where JournalPath says, Status reports it; a journal too small, or
// another array's, is refused before any file is made.
func TestJournalFiles(t *testing.T) {
	dir := t.TempDir()
	wd, _ := os.Getwd()
	t.Chdir(dir)
	paths := memberPaths(dir, 3)
	opts := raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize, Consistency: raid.ConsistencyJournal,
		JournalPath: "j.log", JournalSize: 2 << 20}
	a, err := raid.Create(paths, opts)
	if err != nil {
		t.Fatal(err)
	}
	p := bytes.Repeat([]byte("journal!"), 1000)
	if _, err := a.WriteAt(p, 5000); err != nil {
		t.Fatal(err)
	}
	st := a.Status()
	if st.Consistency != raid.ConsistencyJournal || st.Journal == nil || st.Journal.Path != filepath.Join(dir, "j.log") ||
		st.Journal.Size != 2<<20-8192 || st.Bitmap != nil {
		t.Fatalf("status: %q %+v, bitmap %+v", st.Consistency, st.Journal, st.Bitmap)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat("j.log"); err != nil || fi.Size() != 2<<20 {
		t.Fatalf("journal file: %v", err)
	}
	os.Chdir(wd)
	b, err := raid.Assemble(paths, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if _, err := b.ReadAt(got, 5000); err != nil || !bytes.Equal(got, p) {
		t.Fatal("read back", err)
	}
	b.Close()
	if err := os.Rename(filepath.Join(dir, "j.log"), filepath.Join(dir, "moved.log")); err != nil {
		t.Fatal(err)
	}
	c, err := raid.Assemble(paths, raid.AssembleOptions{JournalPath: filepath.Join(dir, "moved.log")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.Journal.Path != filepath.Join(dir, "moved.log") || st.Journal.Records == 0 {
		t.Fatalf("journal %+v", st.Journal)
	}
	c.Close()

	// Refusals.
	d2 := t.TempDir()
	small := opts
	small.JournalPath, small.JournalSize = filepath.Join(d2, "small"), 512<<10
	if _, err := raid.Create(memberPaths(d2, 3), small); !errors.Is(err, raid.ErrJournal) {
		t.Fatalf("journal too small: %v", err)
	}
	reuse := opts
	reuse.JournalPath = filepath.Join(dir, "moved.log")
	if _, err := raid.Create(memberPaths(d2, 3), reuse); !errors.Is(err, raid.ErrInUse) {
		t.Fatalf("another array's journal: %v", err)
	}
	if ents, _ := os.ReadDir(d2); len(ents) != 0 {
		t.Fatalf("refused Creates left %d files behind", len(ents))
	}
}

// BenchmarkConsistency: random 4 KiB writes from 4 goroutines over a 4-member array of files
// on /dev/shm (64 KiB chunks, 3×32 MiB, stripe cache on), with each consistency policy — none,
// bitmap, journal (a 64 MiB journal file on /dev/shm too) — side by side: run with -count 6
// and compare with benchstat. The time includes the final Flush. jbytes/op is journal bytes
// written per write, jcommit/op journal writes (each with an fdatasync) per write.
func BenchmarkConsistency(b *testing.B) {
	for _, policy := range []string{raid.ConsistencyNone, raid.ConsistencyBitmap, raid.ConsistencyJournal} {
		b.Run(policy, func(b *testing.B) {
			const members, memberData = 4, 32 << 20
			dir := shmDir(b)
			opts := raid.CreateOptions{Chunk: 64 << 10, MemberSize: raid.DataOffset + memberData, Consistency: policy}
			if policy == raid.ConsistencyJournal {
				opts.JournalPath = filepath.Join(dir, "journal")
			}
			a, err := raid.Create(memberPaths(dir, members), opts)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			randWrite4K(b, a)
			if j := a.Status().Journal; j != nil {
				head, _, _, _, _ := raid.JournalPosition(a) // bytes logged since Create
				b.ReportMetric(float64(head)/float64(b.N), "jbytes/op")
				b.ReportMetric(float64(j.Commits)/float64(b.N), "jcommit/op")
			}
		})
	}
}

// snapshot returns the contents of the files at paths, to prove a refusal wrote nothing.
func snapshot(t *testing.T, paths ...string) [][]byte {
	t.Helper()
	out := make([][]byte, len(paths))
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

// TestJournalOnMember: a journal that is a member's own file — a hard link of a member or of a
// spare (the same inode under another name), given plainly or as a volatile: spec — is
// refused by Create and by Assemble with ErrJournalOnMember, naming both paths, before
// anything is written: every member byte and the real journal are unchanged, and no file is
// left behind. A journal file merely on the members' filesystem is legal;
// JournalSharesFilesystem finds it (create warns).
func TestJournalOnMember(t *testing.T) {
	dir := t.TempDir()
	paths := memberPaths(dir, 3)
	spare := filepath.Join(dir, "spare.img")
	rng := rand.New(rand.NewPCG(7, 8))
	for _, p := range append(paths, spare) {
		b := make([]byte, memberSize)
		fill(rng, b)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "journal-link")
	spareLink := filepath.Join(dir, "spare-link")
	if err := os.Link(paths[1], link); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(spare, spareLink); err != nil {
		t.Fatal(err)
	}
	all := append(paths[:3:3], spare)
	before := snapshot(t, all...)
	opts := raid.CreateOptions{Chunk: testChunk, Consistency: raid.ConsistencyJournal, JournalSize: 2 << 20}
	for _, c := range []struct{ journal, member string }{
		{link, paths[1]},
		{faulty.VolatilePrefix + link, paths[1]},
		{faulty.Prefix + link + "?delay=1ms", paths[1]},
		{spareLink, spare},
	} {
		o := opts
		o.JournalPath, o.Spares = c.journal, []string{spare}
		_, err := raid.Create(paths, o)
		if !errors.Is(err, raid.ErrJournalOnMember) || !strings.Contains(err.Error(), raid.SpecPath(c.journal)) ||
			!strings.Contains(err.Error(), c.member) {
			t.Fatalf("Create with journal %s: %v; want ErrJournalOnMember naming it and %s", c.journal, err, c.member)
		}
		t.Logf("Create with journal %s: %v", c.journal, err)
	}
	for i, b := range snapshot(t, all...) {
		if !bytes.Equal(b, before[i]) {
			t.Fatalf("a refused Create changed %s", all[i])
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 6 {
		t.Fatalf("refused Creates left %d files in the directory, want the 6 made here", len(ents))
	}

	// A journal file next to the members is legal, and found.
	journal := filepath.Join(dir, "journal.img")
	o := opts
	o.JournalPath, o.Force = journal, true
	a, err := raid.Create(paths, o)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := raid.JournalSharesFilesystem(journal, paths); !ok || m != paths[0] {
		t.Errorf("JournalSharesFilesystem = %q, %v; want %s", m, ok, paths[0])
	}
	if m, ok := raid.JournalSharesFilesystem("/proc/self/status", paths); ok {
		t.Errorf("JournalSharesFilesystem of a file on /proc: %q", m)
	}
	if _, err := a.WriteAt(bytes.Repeat([]byte{9}, 10000), 3000); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	all = append(all, journal)
	before = snapshot(t, all...)
	for _, jp := range []string{link, faulty.VolatilePrefix + link} {
		b, err := raid.Assemble(paths, raid.AssembleOptions{JournalPath: jp})
		if err == nil {
			b.Close()
		}
		if !errors.Is(err, raid.ErrJournalOnMember) || !strings.Contains(err.Error(), paths[1]) {
			t.Fatalf("Assemble with journal %s: %v; want ErrJournalOnMember naming %s", jp, err, paths[1])
		}
	}
	for i, b := range snapshot(t, all...) {
		if !bytes.Equal(b, before[i]) {
			t.Fatalf("a refused Assemble changed %s", all[i])
		}
	}
}

// TestJournalVolatileSpec: a journal given as volatile:PATH works as a power-cut test of the
// journal itself. Create records the spec (PATH made absolute); a child process assembles the
// array by that record, writes with the cache off (each write's record is synced to the
// journal before its member writes), flushes some and not the rest, and is SIGKILLed, losing
// whatever of the journal was not synced. The next Assemble replays the journal through the
// spec: every byte reads as written, and with each member left out in turn (degraded, read
// from parity) the array still reads the same, so parity is right everywhere.
func TestJournalVolatileSpec(t *testing.T) {
	dir := os.Getenv("RAID5D_VOLATILE_JOURNAL_CHILD")
	child := dir != ""
	if !child {
		dir = t.TempDir()
	}
	paths := memberPaths(dir, 3)
	want := func() []byte { // what the array holds at the end: the child's writes over zeroes
		b := make([]byte, 2*16*testChunk)
		fill(rand.New(rand.NewPCG(3, 4)), b)
		return b
	}()
	if child {
		a, err := raid.Assemble(paths, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
		if err != nil {
			t.Fatal(err)
		}
		half := len(want) / 2
		if _, err := a.WriteAt(want[:half], 0); err != nil {
			t.Fatal(err)
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		for off := half; off < len(want); off += 5000 { // unaligned: read-modify-writes
			if _, err := a.WriteAt(want[off:min(off+5000, len(want))], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Println("written")
		select {} // killed here, the array never closed
	}

	wd, _ := os.Getwd()
	t.Chdir(dir)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize,
		Consistency: raid.ConsistencyJournal, JournalPath: faulty.VolatilePrefix + "j.log", JournalSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if p := a.Status().Journal.Path; p != faulty.VolatilePrefix+filepath.Join(dir, "j.log") {
		t.Fatalf("recorded journal %q", p)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	os.Chdir(wd)
	cmd := exec.Command(os.Args[0], "-test.run=^TestJournalVolatileSpec$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RAID5D_VOLATILE_JOURNAL_CHILD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Kill()
	cmd.Wait()
	if line != "written\n" {
		t.Fatalf("child: %q", line)
	}

	b, err := raid.Assemble(paths, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := b.Status()
	if st.Journal == nil || st.Journal.Replayed == 0 || st.Unclean {
		t.Fatalf("after the kill: journal %+v, unclean %v; want records replayed, no resync", st.Journal, st.Unclean)
	}
	got := make([]byte, len(want))
	if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the replay: %v, first difference at %d", err, firstDiff(got, want))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for leave := range paths {
		rest := slices.Delete(slices.Clone(paths), leave, leave+1)
		c, err := raid.Assemble(rest, raid.AssembleOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		clear(got)
		if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("without %s: %v, first difference at %d", paths[leave], err, firstDiff(got, want))
		}
		c.Close()
	}
}
