package cache

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/parity"
	"github.com/raid5d/raid5d/stripe"
)

// memMembers is an in-memory Backend: each role's data area as a slice.
type memMembers struct {
	mu          sync.Mutex // guards data, reads, written
	data        [][]byte   // by role; nil for the missing role
	missing     int
	reads       int64 // bytes read
	written     int64 // bytes written
	vecWrites   int   // vectored write ops
	plainWrites int   // write ops not vectored
}

func (m *memMembers) Missing(int64) int { return m.missing }

func (m *memMembers) Do(ops []stripe.MemberOp) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, op := range ops {
		if op.Role == m.missing {
			panic(fmt.Sprintf("I/O to the missing member %d", op.Role))
		}
		if op.Vec != nil {
			if !op.Write {
				panic("a vectored read")
			}
			off := op.Off
			for _, b := range op.Vec {
				copy(m.data[op.Role][off:off+int64(len(b))], b)
				off += int64(len(b))
			}
			m.written += off - op.Off
			m.vecWrites++
			continue
		}
		d := m.data[op.Role][op.Off : op.Off+int64(len(op.Buf))]
		if op.Write {
			copy(d, op.Buf)
			m.written += int64(len(op.Buf))
			m.plainWrites++
		} else {
			copy(op.Buf, d)
			m.reads += int64(len(op.Buf))
		}
	}
	return nil
}

// newTestCache returns a cache of capacity stripes over members holding random data with
// correct parity, its members, and the array's contents (the model).
func newTestCache(t testing.TB, l stripe.Layout, stripes int64, capacity, missing int, seed uint64) (*Cache, *memMembers, []byte) {
	t.Helper()
	coder, err := parity.New(l.DataMembers())
	if err != nil {
		t.Fatal(err)
	}
	C := l.ChunkSize()
	mm := &memMembers{data: make([][]byte, l.Members()), missing: missing}
	for r := range mm.data {
		mm.data[r] = make([]byte, stripes*C)
	}
	model := make([]byte, stripes*l.StripeSize())
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range model {
		model[i] = byte(rng.Uint32())
	}
	for s := range stripes {
		P := mm.data[l.ParityMember(s)][s*C : (s+1)*C]
		for d := range l.DataMembers() {
			chunk := model[(s*int64(l.DataMembers())+int64(d))*C:][:C]
			copy(mm.data[l.DataMember(s, d)][s*C:], chunk)
			subtle.XORBytes(P, P, chunk)
		}
	}
	var locks stripe.Locks
	c := New(l, coder, mm, &locks, Options{Stripes: capacity, WriteBackDelay: 100 * time.Microsecond, WriteBackers: 2})
	return c, mm, model
}

// check compares what the members hold with the model: every present data chunk, and every
// present parity chunk against the XOR of the model's data (which also covers the missing
// member's chunks).
func check(t *testing.T, l stripe.Layout, mm *memMembers, model []byte) {
	t.Helper()
	C := l.ChunkSize()
	stripes := int64(len(model)) / l.StripeSize()
	P := make([]byte, C)
	for s := range stripes {
		clear(P)
		for d := range l.DataMembers() {
			want := model[(s*int64(l.DataMembers())+int64(d))*C:][:C]
			subtle.XORBytes(P, P, want)
			if r := l.DataMember(s, d); r != mm.missing && !bytes.Equal(mm.data[r][s*C:(s+1)*C], want) {
				t.Fatalf("stripe %d data %d (role %d) differs from the model", s, d, r)
			}
		}
		if r := l.ParityMember(s); r != mm.missing && !bytes.Equal(mm.data[r][s*C:(s+1)*C], P) {
			t.Fatalf("stripe %d: parity (role %d) is not the XOR of the data", s, r)
		}
	}
}

// readModel is a miss function that reads the model, as the array would read or rebuild the
// members: the cache must call it only for units it does not hold, so a stale model would show.
func readMembers(l stripe.Layout, mm *memMembers) func([]byte, stripe.Extent) error {
	return func(dst []byte, e stripe.Extent) error {
		mm.mu.Lock()
		defer mm.mu.Unlock()
		if e.Member != mm.missing {
			copy(dst, mm.data[e.Member][e.MemberOff:])
			return nil
		}
		clear(dst)
		s := e.Stripe
		for r := range mm.data {
			if r != mm.missing {
				subtle.XORBytes(dst, dst, mm.data[r][e.MemberOff:e.MemberOff+e.Len])
			}
		}
		_ = s
		return nil
	}
}

// TestCacheRandom writes random pieces — whole stripes, whole units (pinned or not), odd
// ranges — through a small cache with every member missing in turn, reads each back at once
// through ReadExtent, and after Close compares every member byte with the model. Pinned
// buffers are scribbled over on release, so a read after release would show as wrong data, and
// each must be released exactly once.
func TestCacheRandom(t *testing.T) {
	for _, n := range []int{3, 5} {
		l, _ := stripe.NewLayout(n, 8<<10, stripe.LeftSymmetric)
		for missing := -1; missing < n; missing++ {
			t.Run(fmt.Sprintf("n%d-missing%d", n, missing), func(t *testing.T) {
				const stripes = 6
				c, mm, model := newTestCache(t, l, stripes, 3, missing, uint64(n*10+missing+1))
				c.Start(t.Context())
				miss := readMembers(l, mm)
				rng := rand.New(rand.NewPCG(uint64(missing+2), 7))
				size := int64(len(model))
				var outstanding atomic.Int64
				for range 400 {
					var off, ln int64
					switch rng.IntN(5) {
					case 0: // a whole stripe
						off, ln = rng.Int64N(stripes)*l.StripeSize(), l.StripeSize()
					case 4: // several stripes, aligned or not: a batch of whole stripes (writeFulls) and the ends
						off = rng.Int64N(stripes-2) * l.StripeSize()
						if rng.IntN(2) == 0 {
							off += rng.Int64N(l.StripeSize())
						}
						ln = min(size-off, (2+rng.Int64N(3))*l.StripeSize())
					case 1, 2: // whole units
						off = rng.Int64N(size/stripe.UnitSize) * stripe.UnitSize
						ln = min(size-off, (1+rng.Int64N(3))*stripe.UnitSize)
					default:
						off = rng.Int64N(size)
						ln = 1 + rng.Int64N(min(size-off, 3*stripe.UnitSize))
					}
					p := make([]byte, ln)
					for i := range p {
						p[i] = byte(rng.Uint32())
					}
					var pin *Pin
					if rng.IntN(2) == 0 {
						outstanding.Add(1)
						var calls atomic.Int32
						pin = NewPin(func() {
							if calls.Add(1) != 1 {
								t.Error("released twice")
							}
							for i := range p {
								p[i] = 0xee
							}
							outstanding.Add(-1)
						})
					}
					want := bytes.Clone(p)
					if _, err := c.Write(p, off, pin != nil, pin); err != nil {
						t.Fatal(err)
					}
					if pin != nil {
						pin.Drop()
					}
					copy(model[off:], want)
					got := make([]byte, ln)
					for _, e := range l.Extents(nil, off, ln) {
						if err := c.ReadExtent(got[e.BufOff:e.BufOff+e.Len], e, miss); err != nil {
							t.Fatal(err)
						}
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("read after write at %d+%d differs", off, ln)
					}
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				if n := outstanding.Load(); n != 0 {
					t.Fatalf("%d pinned buffers not released after Close", n)
				}
				check(t, l, mm, model)
				ct := c.Counters()
				if ct.FullStripeWrites == 0 || ct.RCWWrites+ct.RMWWrites == 0 || ct.Evictions == 0 {
					t.Errorf("want every kind of write-out and evictions: %+v", ct)
				}
				if mm.vecWrites == 0 {
					t.Error("no batch of whole stripes was written with vectored member writes")
				}
			})
		}
	}
}

// TestCacheDegradedPlan: in a stripe whose missing member holds data, a unit column where the
// cache knows the missing unit is reconstruct-written (the missing unit is never read), and one
// where it does not is read-modify-written.
func TestCacheDegradedPlan(t *testing.T) {
	l, _ := stripe.NewLayout(4, 8<<10, stripe.LeftSymmetric) // 2 units per chunk, 3 data chunks
	missing := l.DataMember(0, 0)
	c, mm, model := newTestCache(t, l, 2, 4, missing, 5)
	// Unit 0 of the missing chunk (known once written) and unit 1 of data chunk 1 (missing
	// unit not known: RMW reads old data and parity, 2 units).
	a := bytes.Repeat([]byte{1}, stripe.UnitSize)
	b := bytes.Repeat([]byte{2}, stripe.UnitSize)
	offB := l.ChunkSize() + stripe.UnitSize
	for _, w := range []struct {
		p   []byte
		off int64
	}{{a, 0}, {b, offB}} {
		if _, err := c.Write(w.p, w.off, false, nil); err != nil {
			t.Fatal(err)
		}
		copy(model[w.off:], w.p)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	// Column 0: RCW reads data chunks 1 and 2 (unit 0); column 1: RMW reads old b and parity.
	if want := int64(4 * stripe.UnitSize); mm.reads != want {
		t.Fatalf("member reads: %d bytes, want %d", mm.reads, want)
	}
	if ct := c.Counters(); ct.RMWWrites != 1 {
		t.Fatalf("counters %+v: want one RMW write-out (mixed)", ct)
	}
	check(t, l, mm, model)
}

// TestAppendRuns: a write-out turns each planned run into member operations, one per piece of
// the run that is contiguous in memory. In a stripe of 2 data chunks of 2 units, a pinned 12 KiB
// write references chunk 0 whole and chunk 1's unit 0 (contiguous in the pinned buffer, across
// the chunk boundary) and a copied write fills chunk 1's unit 1: chunk 0 is one write from the
// pinned buffer, chunk 1 two (the pinned unit and the head's own, not contiguous), parity one.
// Merging across runs would put chunk 1's pinned unit on chunk 0's member; merging without
// contiguous memory would write the bytes after the pinned unit.
func TestAppendRuns(t *testing.T) {
	l, _ := stripe.NewLayout(3, 8<<10, stripe.LeftSymmetric)
	c, _, _ := newTestCache(t, l, 2, 2, -1, 3)
	const U = stripe.UnitSize
	pinned := make([]byte, 3*U)
	for i := range pinned {
		pinned[i] = byte(i / U)
	}
	pin := NewPin(nil)
	if _, err := c.Write(pinned, 0, true, pin); err != nil {
		t.Fatal(err)
	}
	pin.Drop()
	copied := bytes.Repeat([]byte{9}, U)
	if _, err := c.Write(copied, 3*U, false, nil); err != nil {
		t.Fatal(err)
	}
	lk := c.locks.For(0)
	lk.Lock()
	defer lk.Unlock()
	h := c.lookup(0)
	ws := c.getWork()
	defer c.putWork(ws)
	p := &ws.plan
	stripe.PlanWrite(p, l, stripe.WriteState{Stripe: 0, Units: h.st, Missing: -1})
	ops := c.appendRuns(nil, h, ws, p, p.Writes, true)
	pm := l.ParityMember(0)
	want := []struct {
		role int
		off  int64
		buf  []byte
	}{
		{l.DataMember(0, 0), 0, pinned[:2*U]},
		{l.DataMember(0, 1), 0, pinned[2*U:]},
		{l.DataMember(0, 1), U, copied},
		{pm, 0, nil},
	}
	if len(ops) != len(want) {
		for _, op := range ops {
			t.Logf("role %d off %d len %d", op.Role, op.Off, len(op.Buf))
		}
		t.Fatalf("%d member writes, want %d", len(ops), len(want))
	}
	for i, w := range want {
		op := ops[i]
		if op.Role != w.role || op.Off != w.off || !op.Write || op.Stripe != 0 || op.Vec != nil {
			t.Fatalf("write %d: role %d off %d write %v stripe %d, want role %d off %d, a write in stripe 0", i, op.Role, op.Off, op.Write, op.Stripe, w.role, w.off)
		}
		if w.buf == nil {
			if len(op.Buf) != 2*U {
				t.Fatalf("parity write of %d bytes, want %d", len(op.Buf), 2*U)
			}
			continue
		}
		if !bytes.Equal(op.Buf, w.buf) {
			t.Fatalf("write %d (role %d, off %d) writes the wrong bytes", i, op.Role, op.Off)
		}
	}
	if &ops[0].Buf[0] != &pinned[0] || &ops[1].Buf[0] != &pinned[2*U] {
		t.Fatal("the pinned units are not written straight from the pinned buffer")
	}
}
