package faulty

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

// The kinds are registered as cmd/raid5d registers them.
func TestMain(m *testing.M) {
	Register(raid.DataOffset)
	os.Exit(m.Run())
}

// The volatile member (faulty:PATH?volatile) is tested here, inside the package, so that a
// recording member underneath can show the order in which a Sync writes its pages.

// newVolatileFile creates a member file of size bytes filled with a pattern and returns its
// path and contents.
func newVolatileFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m")
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// TestVolatileSpecModel: random writes, trims and syncs through faulty:PATH?volatile, checked
// byte for byte against two models: what a read sees (every write) and what the file holds
// (only what a Sync wrote out). Close without a Sync then leaves the file as of the last Sync.
func TestVolatileSpecModel(t *testing.T) {
	const size = 256<<10 + 1000 // a short last page
	path, data := newVolatileFile(t, size)
	m, err := member.Open(Prefix+path+"?volatile", member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != path || m.Size() != size {
		t.Fatalf("Name %q Size %d, want %q %d", m.Name(), m.Size(), path, size)
	}
	seen := bytes.Clone(data)   // what reads must return
	stable := bytes.Clone(data) // what the file must hold
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, size)
	for i := range 2000 {
		off := rng.IntN(size)
		n := rng.IntN(min(3*PageSize, size-off) + 1)
		switch r := rng.IntN(20); {
		case r < 13:
			p := make([]byte, n)
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
			if _, err := m.WriteAt(p, int64(off)); err != nil {
				t.Fatalf("op %d: write [%d,+%d): %v", i, off, n, err)
			}
			copy(seen[off:], p)
		case r < 16:
			if r == 15 { // whole pages, as the array trims them
				off = off / PageSize * PageSize
				n = min(n/PageSize*PageSize, size-off)
			}
			if err := m.Trim(int64(off), int64(n)); err != nil {
				t.Fatalf("op %d: trim [%d,+%d): %v", i, off, n, err)
			}
			clear(seen[off : off+n])
		case r < 19:
			got := buf[:n]
			if _, err := m.ReadAt(got, int64(off)); err != nil {
				t.Fatalf("op %d: read [%d,+%d): %v", i, off, n, err)
			}
			if !bytes.Equal(got, seen[off:off+n]) {
				t.Fatalf("op %d: read [%d,+%d) differs from what was written", i, off, n)
			}
		default:
			if err := m.Sync(); err != nil {
				t.Fatalf("op %d: sync: %v", i, err)
			}
			copy(stable, seen)
		}
		if i%100 == 0 {
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(file, stable) {
				t.Fatalf("op %d: the file holds writes not synced, or lacks synced ones", i)
			}
		}
	}
	if _, err := m.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, seen) {
		t.Fatalf("whole read after the run: %v, equal %v", err, bytes.Equal(buf, seen))
	}
	if _, err := m.WriteAt([]byte("lost at close"), 5000); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadAt(buf[:10], 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, stable) {
		t.Fatal("after Close without Sync the file differs from the last Sync's contents")
	}
	for _, bad := range []string{"volatile=maybe", "volatile=2"} {
		if _, err := member.Open(Prefix+path+"?"+bad, member.Exclusive); err == nil {
			t.Fatalf("spec %q accepted", bad)
		}
	}
	// volatile=false is a plain faulty: member: writes reach the file at once.
	m, err = member.Open(Prefix+path+"?volatile=false", member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.WriteAt([]byte("at once"), 0); err != nil {
		t.Fatal(err)
	}
	if file, _ := os.ReadFile(path); !bytes.HasPrefix(file, []byte("at once")) {
		t.Fatal("volatile=false: the write did not reach the file")
	}
}

// recordingMember is a Member in memory that records the pages written to it, and can stop
// (fail every write) after a given number of them, as a process killed in the middle of a
// Sync would.
type recordingMember struct {
	mu        sync.Mutex // guards everything below
	data      []byte
	order     []int64 // page numbers, in the order written
	failAfter int     // writes that succeed before every write fails (< 0: never)
	syncs     int
	onWrite   func(n int) // if set, called after the nth write, r.mu not held
}

var errStopped = errors.New("recordingMember: stopped")

func (r *recordingMember) ReadAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return copy(p, r.data[off:]), nil
}

func (r *recordingMember) WriteAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failAfter >= 0 && len(r.order) >= r.failAfter {
		return 0, errStopped
	}
	r.order = append(r.order, off/PageSize)
	n := copy(r.data[off:], p)
	if r.onWrite != nil {
		r.mu.Unlock()
		r.onWrite(len(r.order))
		r.mu.Lock()
	}
	return n, nil
}

// written returns how many writes have reached r.
func (r *recordingMember) written() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order)
}

func (r *recordingMember) Trim(off, n int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.data[off : off+n])
	return nil
}

func (r *recordingMember) Sync() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncs++
	return nil
}

func (r *recordingMember) Size() int64  { return int64(len(r.data)) }
func (r *recordingMember) Close() error { return nil }
func (r *recordingMember) Name() string { return "recording" }

// TestVolatileSyncOrder: a Sync writes its batch page by page in a random order, so a kill in
// the middle leaves a random subset; a Sync that fails part way keeps the pages it did not
// write cached, and the next Sync writes them.
func TestVolatileSyncOrder(t *testing.T) {
	const pages = 64
	rec := &recordingMember{data: make([]byte, pages*PageSize), failAfter: -1}
	v := NewVolatile(rec)
	page := bytes.Repeat([]byte{7}, PageSize)
	for pg := range int64(pages) {
		if _, err := v.WriteAt(page, pg*PageSize); err != nil {
			t.Fatal(err)
		}
	}
	if rec.order != nil {
		t.Fatalf("writes reached the member before Sync: %v", rec.order)
	}
	if err := v.Sync(); err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(rec.order)
	slices.Sort(got)
	want := make([]int64, pages)
	for i := range want {
		want[i] = int64(i)
	}
	if !slices.Equal(got, want) || rec.syncs != 1 {
		t.Fatalf("Sync wrote pages %v and synced %d times, want each of the %d pages once and one sync", rec.order, rec.syncs, pages)
	}
	if slices.IsSorted(rec.order) {
		t.Fatalf("Sync wrote its %d pages in ascending order, want a random order", pages)
	}

	// A Sync stopped after 10 pages: 10 pages reached the member, the rest stay readable
	// through the cache and reach the member at the next Sync.
	for pg := range int64(pages) {
		if _, err := v.WriteAt(bytes.Repeat([]byte{byte(pg + 100)}, PageSize), pg*PageSize); err != nil {
			t.Fatal(err)
		}
	}
	rec.order, rec.failAfter = nil, 10
	if err := v.Sync(); !errors.Is(err, errStopped) {
		t.Fatalf("Sync over a failing member: %v, want errStopped", err)
	}
	if len(rec.order) != 10 {
		t.Fatalf("%d pages written before the failure, want 10", len(rec.order))
	}
	for pg := range int64(pages) {
		onMember := rec.data[pg*PageSize] == byte(pg+100)
		if onMember != slices.Contains(rec.order, pg) {
			t.Fatalf("page %d: on the member %v, but written %v", pg, onMember, slices.Contains(rec.order, pg))
		}
	}
	rec.failAfter = -1
	if err := v.Sync(); err != nil {
		t.Fatal(err)
	}
	for pg := range int64(pages) {
		if !bytes.Equal(rec.data[pg*PageSize:(pg+1)*PageSize], bytes.Repeat([]byte{byte(pg + 100)}, PageSize)) {
			t.Fatalf("page %d not on the member after the retried Sync", pg)
		}
	}
}

// TestVolatileConcurrent: reads and writes on other pages proceed while a Sync writes its
// batch, and each sees the newest contents (run with -race).
func TestVolatileConcurrent(t *testing.T) {
	const pages = 32
	rec := &recordingMember{data: make([]byte, 2*pages*PageSize), failAfter: -1}
	v := NewVolatile(rec)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			buf := make([]byte, PageSize)
			for i := range 200 {
				pg := int64(w*pages + i%pages)
				p := bytes.Repeat([]byte{byte(i)}, PageSize)
				if _, err := v.WriteAt(p, pg*PageSize); err != nil {
					t.Error(err)
					return
				}
				if _, err := v.ReadAt(buf, pg*PageSize); err != nil || !bytes.Equal(buf, p) {
					t.Errorf("page %d: read %v, equal %v", pg, err, bytes.Equal(buf, p))
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			if err := v.Sync(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	if err := v.Sync(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2*pages*PageSize)
	if _, err := v.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, rec.data) {
		t.Fatalf("after the last Sync the member differs from what reads see: %v", err)
	}
}

// TestVolatileSpelling: volatile:PATH?k=v behaves as faulty:PATH?volatile&k=v — the same
// injected fault, the same write kept by a Sync and the same unsynced write lost at Close,
// leaving the two files identical byte for byte — and a malformed spec is refused with an
// error that names it (never fs.ErrNotExist, which Assemble takes for a missing member).
func TestVolatileSpelling(t *testing.T) {
	const size = 64 << 10
	pairs := [][2]string{
		{Prefix + "%s?volatile", VolatilePrefix + "%s"},
		{Prefix + "%s?volatile&rfail=8K+4K", VolatilePrefix + "%s?rfail=8K+4K"},
	}
	for _, pair := range pairs {
		var files [2][]byte
		var orig []byte
		for i, form := range pair {
			path, data := newVolatileFile(t, size)
			orig = data
			spec := strings.Replace(form, "%s", path, 1)
			m, err := member.Open(spec, member.Exclusive)
			if err != nil {
				t.Fatalf("%s: %v", spec, err)
			}
			if m.Name() != path {
				t.Errorf("%s: Name %q, want %q", spec, m.Name(), path)
			}
			kept, lost := bytes.Repeat([]byte("k"), 5000), bytes.Repeat([]byte("l"), 5000)
			if _, err := m.WriteAt(kept, 100); err != nil {
				t.Fatal(err)
			}
			if err := m.Sync(); err != nil {
				t.Fatal(err)
			}
			if _, err := m.WriteAt(lost, 20000); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(lost))
			if _, err := m.ReadAt(got, 20000); err != nil || !bytes.Equal(got, lost) {
				t.Fatalf("%s: the unsynced write does not read back: %v", spec, err)
			}
			_, err = m.ReadAt(got[:10], 9000)
			if wantFault := strings.Contains(spec, "rfail"); errors.Is(err, ErrInjected) != wantFault {
				t.Fatalf("%s: read in the rfail range: %v", spec, err)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if files[i], err = os.ReadFile(path); err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(orig)
			copy(want[100:], kept)
			if !bytes.Equal(files[i], want) {
				t.Fatalf("%s: after Close the file is not the original with the synced write only", spec)
			}
		}
		if !bytes.Equal(files[0], files[1]) {
			t.Fatalf("%s and %s left different files", pair[0], pair[1])
		}
	}

	path, _ := newVolatileFile(t, size)
	for _, bad := range []string{
		VolatilePrefix,
		VolatilePrefix + "?rfail=0+1",
		Prefix + "?volatile",
		VolatilePrefix + path + "?volatile",
		VolatilePrefix + path + "?volatile=false",
		VolatilePrefix + path + "?bogus=1",
		VolatilePrefix + path + "?after=-1",
		VolatilePrefix + path + "?wfail=12",
	} {
		m, err := member.Open(bad, member.Exclusive)
		if err == nil {
			m.Close()
			t.Errorf("spec %q accepted", bad)
			continue
		}
		if errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("spec %q: error %q should name the spec and not be ErrNotExist", bad, err)
		}
	}
	// A spec whose file does not exist is a missing member, as a plain path is.
	if _, err := member.Open(VolatilePrefix+path+".absent?rfail=0+1", member.Exclusive); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("absent file: %v, want fs.ErrNotExist", err)
	}
}

// TestSpecPath: SpecPath finds the file of each spelling, and MapSpecPath rewrites only it.
func TestSpecPath(t *testing.T) {
	abs := func(p string) (string, error) { return "/d/" + p, nil }
	for _, c := range []struct{ spec, path, mapped string }{
		{"m0.img", "m0.img", "/d/m0.img"},
		{"a?b", "a?b", "/d/a?b"}, // a plain path keeps its '?'
		{"faulty:m0.img", "m0.img", "faulty:/d/m0.img"},
		{"faulty:m0.img?volatile&rfail=0+4K", "m0.img", "faulty:/d/m0.img?volatile&rfail=0+4K"},
		{"volatile:j.log", "j.log", "volatile:/d/j.log"},
		{"volatile:j.log?delay=1ms", "j.log", "volatile:/d/j.log?delay=1ms"},
		{"volatile:j.log?", "j.log", "volatile:/d/j.log?"},
	} {
		if got := member.SpecPath(c.spec); got != c.path {
			t.Errorf("SpecPath(%q) = %q, want %q", c.spec, got, c.path)
		}
		if got, err := member.MapSpecPath(c.spec, abs); err != nil || got != c.mapped {
			t.Errorf("MapSpecPath(%q) = %q, %v; want %q", c.spec, got, err, c.mapped)
		}
	}
	boom := errors.New("boom")
	if _, err := member.MapSpecPath("volatile:x", func(string) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Errorf("MapSpecPath error: %v", err)
	}
}

// TestDelayControlled: with ctl, delay sleeps only while the control file exists, so a member
// can assemble at full speed and start hanging later; without the file a read or write of a
// member with a 10-minute delay returns at once.
func TestDelayControlled(t *testing.T) {
	dir := t.TempDir()
	path, ctl := filepath.Join(dir, "m"), filepath.Join(dir, "slow")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := member.Open(Prefix+path+"?delay=10m&ctl="+ctl, member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.WriteAt([]byte{1}, 0)
		if err == nil {
			_, err = m.ReadAt(make([]byte, 1), 0)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("delay slept without its control file")
	}
	m.Close()
	if m, err = member.Open(Prefix+path+"?delay=30ms&ctl="+ctl, member.Exclusive); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := os.WriteFile(ctl, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := m.WriteAt([]byte{2}, 0); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("write took %v with delay=30ms and its control file present", d)
	}
}

// TestSpecAsFaults: a spec's keys keep their meaning as the Member's Faults they become: a
// write that wfail and drop both select fails, whichever key comes first; an empty range
// selects nothing (a Fault with Len 0 would select everything); and after is one count for
// all the spec's faults, reads and writes together.
func TestSpecAsFaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m")
	if err := os.WriteFile(path, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	open := func(query string) member.Member {
		t.Helper()
		m, err := member.Open(Prefix+path+"?"+query, member.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	buf := make([]byte, 4096)
	m := open("drop=0+8K&wfail=4K+4K")
	if _, err := m.WriteAt(buf, 4096); !errors.Is(err, ErrInjected) {
		t.Errorf("write selected by drop and wfail: %v, want ErrInjected", err)
	}
	if n, err := m.WriteAt(buf, 0); err != nil || n != len(buf) {
		t.Errorf("write selected by drop alone = %d, %v; want dropped (%d, nil)", n, err, len(buf))
	}
	m.Close()
	m = open("rfail=0+0&wfail=8K+0")
	if _, err := m.ReadAt(buf, 0); err != nil {
		t.Errorf("read with rfail=0+0: %v, want no fault", err)
	}
	if _, err := m.WriteAt(buf, 8192); err != nil {
		t.Errorf("write with wfail=8K+0: %v, want no fault", err)
	}
	m.Close()
	m = open("rfail=0+4K&wfail=0+4K&after=2")
	if _, err := m.ReadAt(buf, 0); err != nil {
		t.Errorf("first matching operation (a read): %v, want it to pass", err)
	}
	if _, err := m.WriteAt(buf, 0); err != nil {
		t.Errorf("second matching operation (a write): %v, want it to pass", err)
	}
	if _, err := m.ReadAt(buf, 8192); err != nil {
		t.Errorf("a read no fault selects: %v", err)
	}
	if _, err := m.ReadAt(buf, 0); !errors.Is(err, ErrInjected) {
		t.Errorf("third matching operation (a read): %v, want ErrInjected", err)
	}
}

// TestVolatilePowerCutDuringSync: a PowerCut that lands while a Sync is writing its batch
// stops it: no page reaches the member underneath after the cut, the Sync fails with
// ErrPoweredOff, the pages it had not written are lost (keep 0) rather than cached again, and
// after Reopen reads see exactly what reached the member.
func TestVolatilePowerCutDuringSync(t *testing.T) {
	const pages = 64
	rec := &recordingMember{data: make([]byte, pages*PageSize), failAfter: -1}
	v := NewVolatile(rec)
	for pg := range int64(pages) {
		if _, err := v.WriteAt(bytes.Repeat([]byte{byte(pg + 1)}, PageSize), pg*PageSize); err != nil {
			t.Fatal(err)
		}
	}
	reached, resume := make(chan struct{}), make(chan struct{})
	rec.onWrite = func(n int) {
		if n == 10 {
			close(reached)
			<-resume
		}
	}
	synced := make(chan error, 1)
	go func() { synced <- v.Sync() }()
	<-reached // the Sync is inside its 10th page write, holding v.mu for reading
	cut := make(chan struct{})
	go func() {
		PowerCut(0, nil, v)
		close(cut)
	}()
	for v.mu.TryRLock() { // until PowerCut waits for the lock: it then comes before page 11
		v.mu.RUnlock()
		time.Sleep(time.Millisecond)
	}
	close(resume)
	<-cut
	atCut := rec.written()
	if err := <-synced; !errors.Is(err, ErrPoweredOff) {
		t.Fatalf("Sync cut off by PowerCut: %v, want ErrPoweredOff", err)
	}
	if n := rec.written(); n != 10 || atCut != 10 {
		t.Fatalf("%d pages on the member at the cut and %d after the Sync returned, want 10 and 10", atCut, n)
	}
	if _, err := v.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrPoweredOff) {
		t.Fatalf("read while powered off: %v, want ErrPoweredOff", err)
	}
	v.Reopen()
	if n := v.Unsynced(); n != 0 {
		t.Fatalf("%d pages cached after the cut, want 0", n)
	}
	got := make([]byte, pages*PageSize)
	if _, err := v.ReadAt(got, 0); err != nil || !bytes.Equal(got, rec.data) {
		t.Fatalf("after Reopen reads differ from the member underneath: %v", err)
	}
	for pg := range int64(pages) {
		onMember := rec.data[pg*PageSize] == byte(pg+1)
		if onMember != slices.Contains(rec.order, pg) {
			t.Fatalf("page %d: on the member %v, written by the Sync %v", pg, onMember, slices.Contains(rec.order, pg))
		}
	}
}
