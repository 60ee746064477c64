package journal

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// memDev is an in-memory Device with a power cut: data is what reads see, synced what
// survives Crash.
type memDev struct {
	mu           sync.Mutex
	data, synced []byte
	syncs, vecs  int
	// onVec, if set, runs at the start of every WriteVec, without mu.
	onVec func()
}

func newDev(size int) *memDev { return &memDev{data: make([]byte, size), synced: make([]byte, size)} }

func (d *memDev) Name() string { return "memdev" }
func (d *memDev) Size() int64  { return int64(len(d.data)) }
func (d *memDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(p, d.data[off:]), nil
}
func (d *memDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(d.data[off:], p), nil
}
func (d *memDev) WriteVec(bufs [][]byte, off int64) (int, error) {
	if d.onVec != nil {
		d.onVec()
	}
	d.mu.Lock()
	d.vecs++
	d.mu.Unlock()
	n := 0
	for _, b := range bufs {
		k, _ := d.WriteAt(b, off+int64(n))
		n += k
	}
	return n, nil
}
func (d *memDev) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.synced, d.data)
	d.syncs++
	return nil
}
func (d *memDev) Close() error { return nil }

// crash loses every write not synced.
func (d *memDev) crash() {
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.data, d.synced)
}

func (d *memDev) image() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes.Clone(d.data)
}

// fakeArray records what the journal asks of the array.
type fakeArray struct {
	mu      sync.Mutex
	applied []Op // copies
	syncs   int
	pending bool // ResyncPending
}

func (a *fakeArray) Apply(op Op) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	op.Buf = bytes.Clone(op.Buf)
	a.applied = append(a.applied, op)
	return nil
}
func (a *fakeArray) Sync() error {
	a.mu.Lock()
	a.syncs++
	a.mu.Unlock()
	return nil
}
func (a *fakeArray) ResyncPending() bool { return a.pending }

var testUUID = UUID{0xde, 0xad}

var testCfg = Config{Path: "memdev", Roles: 4, DataStart: dataOffset, DataEnd: dataOffset + 1<<30,
	Log: slog.New(slog.NewTextHandler(io.Discard, nil))}

// open reads the journal on d as an assembly does and returns it with a fresh fakeArray.
func open(t *testing.T, d *memDev) (*Journal, *fakeArray) {
	t.Helper()
	h, err := ReadHeader(d, testUUID)
	if err != nil {
		t.Fatal(err)
	}
	fa := &fakeArray{}
	return New(fa, d, h, testCfg), fa
}

// create makes a fresh journal on a device of size bytes.
func create(t *testing.T, size int) (*memDev, *Journal, *fakeArray) {
	t.Helper()
	d := newDev(size)
	if _, err := Init(d, testUUID); err != nil {
		t.Fatal(err)
	}
	j, fa := open(t, d)
	return d, j, fa
}

// opsFor returns the ops of a write of stripe s: role s%4 gets 4 KiB of byte s at a
// per-stripe offset; every third stripe also trims role 3.
func opsFor(s int64) []Op {
	ops := []Op{{Role: int(s % 4), Off: dataOffset + s*4096, Buf: bytes.Repeat([]byte{byte(s + 1)}, 4096)}}
	if s%3 == 0 {
		ops = append(ops, Op{Role: 3, Off: dataOffset + s*4096, Trim: 8192})
	}
	return ops
}

func logAll(t *testing.T, j *Journal, from, to int64) {
	t.Helper()
	for s := from; s < to; s++ {
		done, err := j.Log(s, 1, opsFor(s))
		if err != nil {
			t.Fatal(err)
		}
		done()
	}
}

// TestLogDurable: Log returns only once its record is synced on the journal device.
func TestLogDurable(t *testing.T) {
	d, j, _ := create(t, 1<<20)
	logAll(t, j, 0, 1)
	d.crash()
	j2, fa := open(t, d)
	if _, err := j2.Recover(false); err != nil {
		t.Fatal(err)
	}
	if !opsEqual(fa.applied, opsFor(0)) {
		t.Fatalf("replayed %+v, want %+v", fa.applied, opsFor(0))
	}
}

func opsEqual(a, b []Op) bool {
	return slices.EqualFunc(a, b, func(x, y Op) bool {
		return x.Role == y.Role && x.Off == y.Off && x.Trim == y.Trim && bytes.Equal(x.Buf, y.Buf)
	})
}

// TestReplay: after a crash every record since the last checkpoint is replayed, in order,
// the members synced, and the journal emptied: a second assembly replays nothing.
func TestReplay(t *testing.T) {
	d, j, fa := create(t, 1<<20)
	logAll(t, j, 0, 3)
	if err := j.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if fa.syncs != 1 {
		t.Fatalf("checkpoint synced the members %d times, want 1", fa.syncs)
	}
	logAll(t, j, 3, 10)
	d.crash()
	j2, fa2 := open(t, d)
	resync, err := j2.Recover(false)
	if err != nil || resync {
		t.Fatalf("Recover: resync %v, %v", resync, err)
	}
	var want []Op
	for s := int64(3); s < 10; s++ {
		want = append(want, opsFor(s)...)
	}
	if !opsEqual(fa2.applied, want) {
		t.Fatalf("replayed %d ops, want the %d of stripes 3-9 in order", len(fa2.applied), len(want))
	}
	if fa2.syncs != 1 || j2.Status().Replayed != 7 {
		t.Fatalf("%d member syncs, %d records replayed; want 1, 7", fa2.syncs, j2.Status().Replayed)
	}
	// The replay is durable and moved the tail: nothing is replayed twice, and new records
	// after it are.
	logAll(t, j2, 20, 21)
	d.crash()
	j3, fa3 := open(t, d)
	if _, err := j3.Recover(false); err != nil {
		t.Fatal(err)
	}
	if !opsEqual(fa3.applied, opsFor(20)) {
		t.Fatalf("second replay: %d ops, want stripe 20's", len(fa3.applied))
	}
}

// TestGroupCommit: records logged while a group is being written share the next write and
// sync.
func TestGroupCommit(t *testing.T) {
	d, j, _ := create(t, 1<<20)
	syncs0 := d.syncs // Init's
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.onVec = func() { once.Do(func() { close(entered); <-release }) }
	errs := make(chan error, 11)
	log := func(s int64) {
		done, err := j.Log(s, 1, opsFor(s))
		if err == nil {
			done()
		}
		errs <- err
	}
	go log(0)
	<-entered
	for s := range int64(10) {
		go log(1 + s)
	}
	for deadline := time.Now().Add(10 * time.Second); j.Status().Records < 11; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("writers never logged their records")
		}
	}
	close(release)
	for range 11 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if st := j.Status(); st.Commits != 2 || d.syncs-syncs0 != 2 || d.vecs != 2 {
		t.Fatalf("%d commits, %d writes, %d syncs for one record and ten logged together; want 2 each",
			st.Commits, d.vecs, d.syncs-syncs0)
	}
}

// TestRingFull: a writer that finds the ring full checkpoints by itself; the ring wraps and
// a crash then replays only what the last checkpoint left.
func TestRingFull(t *testing.T) {
	d, j, fa := create(t, RingOffset+64<<10) // 16 pages: records of 2 pages
	logAll(t, j, 0, 40)
	st := j.Status()
	if st.FullWaits == 0 || st.Checkpoints == 0 || fa.syncs != int(st.Checkpoints) {
		t.Fatalf("status %+v, %d member syncs: want full waits and one sync per checkpoint", st, fa.syncs)
	}
	d.crash()
	j2, fa2 := open(t, d)
	if _, err := j2.Recover(false); err != nil {
		t.Fatal(err)
	}
	n := j2.Status().Replayed
	var want []Op
	for s := int64(40 - n); s < 40; s++ {
		want = append(want, opsFor(s)...)
	}
	if n == 0 || !opsEqual(fa2.applied, want) {
		t.Fatalf("replayed %d records (%d ops), want the last %d records' ops", n, len(fa2.applied), n)
	}
}

// recordPos returns the ring offset of record i of a fresh journal after logAll(0, n): each
// record of opsFor is two pages, a header page and a payload page.
func recordPos(i int) int64 { return int64(i) * 2 * page }

// TestCorrupt: a record damaged after later groups were synced is ErrCorrupt, with nothing
// applied or written; skipCorrupt discards the journal and asks for a full resync; a damaged
// last record is a torn write and ends the replay quietly.
func TestCorrupt(t *testing.T) {
	for _, tt := range []struct {
		name    string
		damage  int // record index damaged (of 5)
		corrupt bool
	}{{"middle", 1, true}, {"last", 4, false}} {
		t.Run(tt.name, func(t *testing.T) {
			d, j, _ := create(t, 1<<20)
			logAll(t, j, 0, 5)
			off := RingOffset + recordPos(tt.damage) + page + 10 // in the payload
			d.data[off] ^= 1
			d.synced[off] ^= 1
			before := d.image()
			j2, fa := open(t, d)
			_, err := j2.Recover(false)
			if !tt.corrupt {
				if err != nil || len(fa.applied) != len(opsFor(0))+len(opsFor(1))+len(opsFor(2))+len(opsFor(3)) {
					t.Fatalf("torn last record: %v, %d ops applied; want the 4 records before it", err, len(fa.applied))
				}
				return
			}
			if !errors.Is(err, ErrCorrupt) || len(fa.applied) != 0 || fa.syncs != 0 || !bytes.Equal(d.image(), before) {
				t.Fatalf("Recover: %v, %d ops applied, %d syncs, journal changed %v; want ErrCorrupt and nothing done",
					err, len(fa.applied), fa.syncs, !bytes.Equal(d.image(), before))
			}
			resync, err := j2.Recover(true)
			if err != nil || !resync || len(fa.applied) != 0 || !j2.NeedsResync() {
				t.Fatalf("Recover(skipCorrupt): resync %v, %v, %d applied, flag %v", resync, err, len(fa.applied), j2.NeedsResync())
			}
			// The flag survives a reassembly and is cleared by the first checkpoint after the
			// resync has finished.
			j3, fa3 := open(t, d)
			if !j3.NeedsResync() {
				t.Fatal("the resync flag did not reach the header")
			}
			fa3.pending = true
			if err := j3.Checkpoint(); err != nil || !j3.NeedsResync() {
				t.Fatalf("checkpoint during the resync: %v, flag %v", err, j3.NeedsResync())
			}
			fa3.pending = false
			if err := j3.Checkpoint(); err != nil || j3.NeedsResync() {
				t.Fatalf("checkpoint after the resync: %v, flag %v", err, j3.NeedsResync())
			}
		})
	}
}

// TestReplayOutsideData: a record whose op lies outside the data area is refused.
func TestReplayOutsideData(t *testing.T) {
	d, j, _ := create(t, 1<<20)
	done, err := j.Log(0, 1, []Op{{Role: 1, Off: dataOffset - 4096, Buf: make([]byte, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	done()
	j2, fa := open(t, d)
	if _, err := j2.Recover(false); !errors.Is(err, ErrUnusable) || len(fa.applied) != 0 {
		t.Fatalf("Recover: %v, %d applied; want ErrUnusable, none", err, len(fa.applied))
	}
}

// TestHeader: the header names its array; another array's UUID is refused.
func TestHeader(t *testing.T) {
	d := newDev(1 << 20)
	if _, ok := Owner(d); ok {
		t.Fatal("a zeroed device has an owner")
	}
	h, err := Init(d, testUUID)
	if err != nil {
		t.Fatal(err)
	}
	if h.RingSize != 1<<20-RingOffset || h.TailSeq != 1 {
		t.Fatalf("header %+v", h)
	}
	if u, ok := Owner(d); !ok || u != testUUID {
		t.Fatalf("owner %x %v", u, ok)
	}
	if _, err := ReadHeader(d, UUID{1}); !errors.Is(err, ErrUnusable) {
		t.Fatalf("another array's journal: %v", err)
	}
}

// TestLogged: Logged lists, without writing, the stripes of every record a replay would
// rewrite (those since the last checkpoint), and none once the replay has emptied it.
func TestLogged(t *testing.T) {
	d, j, _ := create(t, 1<<20)
	logAll(t, j, 0, 3)
	if err := j.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	logAll(t, j, 3, 10)
	d.crash()
	logged := func() []int64 {
		t.Helper()
		h, err := ReadHeader(d, testUUID)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		all, err := Logged(d, h, func(s0, n int64) {
			for s := s0; s < s0+n; s++ {
				got = append(got, s)
			}
		})
		if err != nil || all {
			t.Fatalf("Logged: all %v, %v", all, err)
		}
		return got
	}
	image := d.image()
	if got, want := logged(), []int64{3, 4, 5, 6, 7, 8, 9}; !slices.Equal(got, want) {
		t.Fatalf("Logged after a crash: stripes %v, want %v", got, want)
	}
	if !bytes.Equal(d.image(), image) {
		t.Fatal("Logged wrote to the journal")
	}
	j2, _ := open(t, d)
	if _, err := j2.Recover(false); err != nil {
		t.Fatal(err)
	}
	if got := logged(); len(got) != 0 {
		t.Fatalf("Logged after the replay: stripes %v, want none", got)
	}
}
