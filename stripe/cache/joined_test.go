package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/parity"
	"github.com/raid5d/raid5d/stripe"
)

// faultyMembers is memMembers whose Do fails, having done nothing, while fail is set.
type faultyMembers struct {
	*memMembers
	fail atomic.Bool
}

var errMemberDown = errors.New("test: member write failed")

func (f *faultyMembers) Do(ops []stripe.MemberOp) error {
	if f.fail.Load() {
		return errMemberDown
	}
	return f.memMembers.Do(ops)
}

// TestJoinedRuns writes a stream of sequential 128 KiB writes over 48 KiB stripes (the kernel
// client's requests: 2 of 3 start inside a stripe whose first part the previous write left in
// its head), and one of 1 MiB writes (joined batches as large as a batch goes), pinned or copied, and breaks the stream between writes in every way that must stop
// a head from being joined to the next write's batch, or must not lose what it holds: a Flush,
// a FUA write (FlushRange) of the previous write, an overlapping write into the head's part or
// the next write's, a read of the range in between, a member's writes failing (the write is
// retried, as a client would), and a member going missing mid-stream. Every write is read back
// at once; pinned buffers are scribbled over on release and must each be released once; at the
// end every member byte is compared with the model. The plain stream must go out as joined
// batches only: member bytes written are 4/3 of the client's, all in vectored writes (no head
// written alone), all of them full-stripe writes (no reads planned).
func TestJoinedRuns(t *testing.T) {
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	ss := l.StripeSize()
	for _, sz := range []struct{ W, stripes, missAt int64 }{
		{128 << 10, 48, 4}, // 2.25 MiB: 18 writes of 128 KiB
		{1 << 20, 64, 1},   // 3 MiB: 3 writes of 1 MiB, whose joined batches are as large as batches go
	} {
		W, stripes := sz.W, sz.stripes
		for _, brk := range []string{"none", "flush", "fua", "overlap-head", "overlap-next", "read", "fail", "missing"} {
			for _, pinned := range []bool{false, true} {
				t.Run(fmt.Sprintf("%dk-%s-pinned-%v", W>>10, brk, pinned), func(t *testing.T) {
					_, mm, model := newTestCache(t, l, stripes, -1, -1, 5)
					coder, _ := parity.New(l.DataMembers())
					fm := &faultyMembers{memMembers: mm}
					var locks stripe.Locks
					c := New(l, coder, fm, &locks, Options{Stripes: 64, WriteBackDelay: time.Hour, WriteBackers: 2})
					miss := readMembers(l, mm)
					rng := rand.New(rand.NewPCG(uint64(len(brk)), 9))
					var outstanding atomic.Int64
					// write writes model's new bytes at off+n, pinned or not, and reads them back.
					write := func(off, n int64, pin bool) error {
						t.Helper()
						p := make([]byte, n)
						for i := 0; i < len(p); i += 8 {
							binary.LittleEndian.PutUint64(p[i:], rng.Uint64())
						}
						want := bytes.Clone(p)
						var pn *Pin
						if pin {
							outstanding.Add(1)
							var calls atomic.Int32
							pn = NewPin(func() {
								if calls.Add(1) != 1 {
									t.Error("released twice")
								}
								for i := range p {
									p[i] = 0xee
								}
								outstanding.Add(-1)
							})
						}
						_, err := c.Write(p, off, pin, pn)
						if pn != nil {
							pn.Drop()
						}
						if err != nil {
							return err
						}
						copy(model[off:], want)
						read(t, c, l, miss, model, off, n)
						return nil
					}
					for i := int64(0); (i+1)*W <= stripes*ss; i++ {
						off := i * W
						if err := write(off, W, pinned); err != nil {
							t.Fatal(err)
						}
						if i%3 != 1 { // break before some writes, after others
							continue
						}
						switch brk {
						case "flush":
							if err := c.Flush(); err != nil {
								t.Fatal(err)
							}
						case "fua":
							if err := c.FlushRange(off, W); err != nil {
								t.Fatal(err)
							}
						case "overlap-head": // into the part of the next write's first stripe this one left in its head
							o := (off+W)/ss*ss + rng.Int64N((off+W)%ss/stripe.UnitSize)*stripe.UnitSize
							if err := write(o, stripe.UnitSize, !pinned); err != nil {
								t.Fatal(err)
							}
						case "overlap-next": // ahead, into the next write's first stripe's remaining part
							if err := write(off+W, stripe.UnitSize, !pinned); err != nil {
								t.Fatal(err)
							}
						case "read":
							read(t, c, l, miss, model, off+W-ss, 2*ss)
						case "fail":
							// The next write's batch fails: it reports the error, the head it
							// completed stays dirty; the client writes it again.
							fm.fail.Store(true)
							p := make([]byte, W)
							if _, err := c.Write(p, off+W, false, nil); !errors.Is(err, errMemberDown) {
								t.Fatalf("write with the members failing: %v, want errMemberDown", err)
							}
							fm.fail.Store(false)
							if !c.Dirty((off+W)/ss, 1) {
								t.Fatal("the head of a failed joined batch is not dirty")
							}
						case "missing":
							if i == sz.missAt {
								mm.mu.Lock()
								mm.missing = l.DataMember((off+W)/ss, 0)
								mm.mu.Unlock()
							}
						}
					}
					if err := c.Flush(); err != nil {
						t.Fatal(err)
					}
					if err := c.Close(); err != nil {
						t.Fatal(err)
					}
					if n := outstanding.Load(); n != 0 {
						t.Fatalf("%d pinned buffers not released", n)
					}
					check(t, l, mm, model)
					if brk == "none" {
						client := stripes * ss
						if got, want := mm.written, client/3*4; got != want || mm.plainWrites != 0 {
							t.Errorf("member bytes written %d for %d client bytes, %d writes not vectored: want %d (4/3), all vectored (no head written alone)",
								got, client, mm.plainWrites, want)
						}
						if ct := c.Counters(); ct.FullStripeWrites != uint64(stripes) || ct.RMWWrites+ct.RCWWrites != 0 {
							t.Errorf("counters %+v: want %d full-stripe writes and no other", ct, stripes)
						}
					}
				})
			}
		}
	}
}

// read reads [off, off+n) through the cache and compares it with the model.
func read(t *testing.T, c *Cache, l stripe.Layout, miss func([]byte, stripe.Extent) error, model []byte, off, n int64) {
	t.Helper()
	got := make([]byte, n)
	for _, e := range l.Extents(nil, off, n) {
		if err := c.ReadExtent(got[e.BufOff:e.BufOff+e.Len], e, miss); err != nil {
			t.Fatal(err)
		}
	}
	if i := firstDiff(got, model[off:off+n]); i >= 0 {
		t.Fatalf("read of %d+%d differs from the model at %d", off, n, off+int64(i))
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestJoinedAllocs: a stream of 128 KiB writes over 48 KiB stripes, pinned, each joining the
// head the last one left to its batch, allocates nothing once the pools are warm.
func TestJoinedAllocs(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations are not counted")
	}
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	const W = 128 << 10
	c, _, _ := newTestCache(t, l, 96, 64, -1, 1) // not started: no write-out goroutines
	c.delay = time.Hour
	p := make([]byte, W)
	off := int64(0)
	n := testing.AllocsPerRun(200, func() {
		pin := NewPin(nil)
		if _, err := c.Write(p, off, true, pin); err != nil {
			t.Fatal(err)
		}
		pin.Drop()
		off = (off + W) % (96 * l.StripeSize())
	})
	if n != 0 {
		t.Errorf("%v allocations per 128 KiB write, want 0", n)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// spanMembers is memMembers that records the most stripes one Do's writes spanned.
type spanMembers struct {
	*memMembers
	most int64
}

func (m *spanMembers) Do(ops []stripe.MemberOp) error {
	lo, hi := int64(-1), int64(-1)
	for _, op := range ops {
		s0, n := op.Span()
		if lo < 0 || s0 < lo {
			lo = s0
		}
		hi = max(hi, s0+n)
	}
	m.most = max(m.most, hi-lo)
	return m.memMembers.Do(ops)
}

// TestJoinedLimitBatch: under LimitBatch(n) (the array's write journal, which holds a batch's
// writes in one bounded record), a head joined to a batch counts: no Backend.Do spans more
// than n stripes, for streams of 128 KiB and 1 MiB writes; and the data is right.
func TestJoinedLimitBatch(t *testing.T) {
	l, _ := stripe.NewLayout(4, 16<<10, stripe.LeftSymmetric)
	for _, W := range []int64{128 << 10, 1 << 20} {
		_, mm, model := newTestCache(t, l, 64, -1, -1, 3)
		coder, _ := parity.New(l.DataMembers())
		sm := &spanMembers{memMembers: mm}
		var locks stripe.Locks
		c := New(l, coder, sm, &locks, Options{Stripes: 64, WriteBackDelay: time.Hour})
		const limit = 4
		c.LimitBatch(limit)
		rng := rand.New(rand.NewPCG(uint64(W), 1))
		for off := int64(0); off+W <= int64(len(model)); off += W {
			for i := off; i < off+W; i += 8 {
				binary.LittleEndian.PutUint64(model[i:], rng.Uint64())
			}
			if _, err := c.Write(bytes.Clone(model[off:off+W]), off, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		check(t, l, mm, model)
		if sm.most > limit || sm.most < 2 {
			t.Errorf("%d KiB writes: a Backend.Do spanned %d stripes, want 2 to %d (LimitBatch)", W>>10, sm.most, limit)
		}
	}
}
