package raid_test

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
	"github.com/raid5d/raid5d/stripe"
)

// Writes to a stripe wait in the cache this long unless something writes them out: tests that
// want write-outs only on Flush use it.
const never = time.Hour

// pauser is a member whose next data-area write, once armed, waits until resume is closed or a
// timeout passes: a window between the parity computation and the member write.
type pauser struct {
	raid.Member
	mu      sync.Mutex // guards the fields below
	armed   bool
	paused  chan struct{} // closed when the write stops
	resume  chan struct{} // closed by the test to let it go on
	timeout time.Duration
}

func (p *pauser) arm(timeout time.Duration) (paused, resume chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.timeout = true, timeout
	p.paused, p.resume = make(chan struct{}), make(chan struct{})
	return p.paused, p.resume
}

func (p *pauser) WriteAt(b []byte, off int64) (int, error) {
	p.mu.Lock()
	fire := p.armed && off >= raid.DataOffset
	if fire {
		p.armed = false
	}
	paused, resume, timeout := p.paused, p.resume, p.timeout
	p.mu.Unlock()
	if fire {
		close(paused)
		select {
		case <-resume:
		case <-time.After(timeout):
		}
	}
	return p.Member.WriteAt(b, off)
}

// newCached creates an array of n in-memory members of chunks chunks each, with opts, and
// returns it with its members (reopened by AssembleMembers, so opts.Logger applies).
func newCached(t *testing.T, n int, chunk, chunks int64, opts raid.AssembleOptions) (*raid.Array, []*raidtest.Mem) {
	t.Helper()
	ms := newMems("c", n, raid.DataOffset+chunks*chunk)
	createClosed(t, ms, raid.CreateOptions{Chunk: chunk})
	a, err := raid.AssembleMembers(asMembers(ms), opts)
	if err != nil {
		t.Fatal(err)
	}
	return a, ms
}

// badStripes returns the stripes of ms (an idle array's members) whose parity chunk is not
// the XOR of their data chunks.
func badStripes(ms []*raidtest.Mem, l stripe.Layout) []int64 {
	C := l.ChunkSize()
	stripes := (ms[0].Size() - raid.DataOffset) / C
	P := make([]byte, C)
	var bad []int64
	for s := range stripes {
		clear(P)
		off := raid.DataOffset + s*C
		for d := range l.DataMembers() {
			subtle.XORBytes(P, P, ms[l.DataMember(s, d)].Bytes()[off:off+C])
		}
		if !bytes.Equal(P, ms[l.ParityMember(s)].Bytes()[off:off+C]) {
			bad = append(bad, s)
		}
	}
	return bad
}

// memberData returns array bytes [off, off+n) as the idle members hold them (n within one chunk).
func memberData(ms []*raidtest.Mem, l stripe.Layout, off, n int64) []byte {
	loc := l.Map(off)
	return ms[loc.Member].Bytes()[raid.DataOffset+loc.MemberOff:][:n]
}

// TestHazard shows why stable pages and pinning matter. A member write is paused after parity
// has been computed, and the caller's buffer changes in that window. When the array skips the
// copy without any promise (the test-only SetUnsafeReference), parity then disagrees with the
// data written. With the copy (the default) the stripe stays consistent and holds the data as
// it was when written; with stable pages and pinned buffers the caller may change its buffer
// only after release, and the stripe stays consistent too. Each case runs a whole-stripe write
// (written during the call) and a one-unit write (written out later, here by Flush).
func TestHazard(t *testing.T) {
	const n, C = 4, 4 << 10
	cases := []struct {
		name         string
		io           raid.IOOptions
		unsafe       bool
		pinned       bool
		whole        bool
		consistent   bool
		waitsRelease bool
	}{
		{name: "unsafe-whole", io: raid.IOOptions{StablePages: true}, unsafe: true, whole: true},
		{name: "unsafe-unit", io: raid.IOOptions{StablePages: true}, unsafe: true},
		{name: "copy-whole", whole: true, consistent: true},
		{name: "copy-unit", consistent: true},
		{name: "pinned-whole", io: raid.IOOptions{StablePages: true}, pinned: true, whole: true, consistent: true},
		{name: "pinned-unit", io: raid.IOOptions{StablePages: true}, pinned: true, consistent: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.unsafe && invariantsEnabled {
				t.Skip("the invariants build panics on the stale parity this case shows")
			}
			ms := newMems("h", n, raid.DataOffset+8*C)
			hooked := make([]raid.Member, n)
			ps := make([]*pauser, n)
			for i, m := range ms {
				ps[i] = &pauser{Member: m}
				hooked[i] = ps[i]
			}
			tc.io.WriteBackDelay = never
			a, err := raid.CreateMembers(hooked, raid.CreateOptions{Chunk: C, IOOptions: tc.io})
			if err != nil {
				t.Fatal(err)
			}
			raid.SetUnsafeReference(a, tc.unsafe)
			l := a.Layout()
			size := int64(C)
			if tc.whole {
				size = l.StripeSize()
			}
			p := make([]byte, size)
			fill(newRand(1), p)
			orig := bytes.Clone(p)
			victim := ps[l.DataMember(0, 0)] // holds p[:C]

			released := make(chan struct{})
			var releases atomic.Int32
			release := func() {
				if releases.Add(1) == 1 {
					close(released)
				}
			}
			timeout := 2 * time.Second
			if tc.pinned {
				timeout = 50 * time.Millisecond // nobody changes the buffer in the window
			}
			paused, resume := make(chan struct{}), make(chan struct{})
			if tc.whole {
				paused, resume = victim.arm(timeout)
			}
			changed := make(chan error, 1)
			mutate := func() {
				select {
				case <-paused:
				case <-time.After(5 * time.Second):
					changed <- errors.New("the member write never started")
					return
				}
				if tc.pinned { // the buffer's owner waits for release, as the nbd server does
					select {
					case <-released:
					case <-time.After(5 * time.Second):
						changed <- errors.New("never released")
						return
					}
				}
				for i := range C {
					p[i] ^= 0xff
				}
				close(resume)
				changed <- nil
			}
			if tc.whole {
				go mutate()
			}
			var wn int
			if tc.pinned {
				wn, err = a.WritePinned(p, 0, release)
			} else {
				wn, err = a.WriteAt(p, 0)
			}
			if err != nil || wn != len(p) {
				t.Fatalf("write: %d, %v", wn, err)
			}
			if !tc.whole { // cached: the write-out happens in Flush
				paused, resume = victim.arm(timeout)
				go mutate()
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-changed; err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.pinned && releases.Load() != 1 {
				t.Fatalf("release ran %d times, want 1", releases.Load())
			}
			bad := badStripes(ms, l)
			if tc.consistent {
				if len(bad) > 0 {
					t.Fatalf("stripes %v have stale parity", bad)
				}
				if got := memberData(ms, l, 0, C); !bytes.Equal(got, orig[:C]) {
					t.Fatalf("member holds data that differs from what was written at byte %d", firstDiff(got, orig))
				}
				return
			}
			if len(bad) != 1 || bad[0] != 0 {
				t.Fatalf("skipping the copy without a promise: inconsistent stripes %v, want [0] (the hazard not shown)", bad)
			}
		})
	}
}

// TestPlan: a single-chunk write to a cold stripe of 3, 4 and 8 members is written out by the
// plan that reads fewer member units — reconstruct-write reads the other D-1 data chunks,
// read-modify-write the old data and parity (2); a tie goes to read-modify-write — and parity
// is right afterwards. Also a one-unit write within a larger chunk, counted in units.
func TestPlan(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	for _, n := range []int{3, 4, 8} {
		for _, chunk := range []int64{4 << 10, 16 << 10} {
			t.Run(fmt.Sprintf("n%d-c%dk", n, chunk>>10), func(t *testing.T) {
				a, ms := newCached(t, n, chunk, 8, raid.AssembleOptions{IOOptions: raid.IOOptions{WriteBackDelay: never}})
				l := a.Layout()
				model := writeModel(t, a, uint64(n))
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				before := a.Counters()
				// The second data chunk of stripe 1, or its second unit.
				off, size := l.StripeSize()+chunk, chunk
				if chunk > stripe.UnitSize {
					off, size = off+stripe.UnitSize, stripe.UnitSize
				}
				p := make([]byte, size)
				fill(newRand(99), p)
				if _, err := a.WriteAt(p, off); err != nil {
					t.Fatal(err)
				}
				copy(model[off:], p)
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				after := a.Counters()
				D := int64(n - 1)
				wantRMW := 2 <= D-1
				reads := min(D-1, 2) * size
				gotRMW, gotRCW := after.RMWWrites-before.RMWWrites, after.RCWWrites-before.RCWWrites
				if wantRMW && (gotRMW != 1 || gotRCW != 0) || !wantRMW && (gotRMW != 0 || gotRCW != 1) {
					t.Fatalf("write-outs: %d RMW, %d RCW; want RMW %v", gotRMW, gotRCW, wantRMW)
				}
				if got := int64(after.MemberBytesRead - before.MemberBytesRead); got != reads {
					t.Fatalf("member bytes read: %d, want %d", got, reads)
				}
				if got := int64(after.MemberBytesWritten - before.MemberBytesWritten); got != 2*size {
					t.Fatalf("member bytes written: %d, want %d (data and parity)", got, 2*size)
				}
				compareArray(t, a, model)
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				if bad := badStripes(ms, l); len(bad) > 0 {
					t.Fatalf("stale parity in stripes %v", bad)
				}
			})
		}
	}
}

// TestBatching: 4 KiB writes in sequence, issued by several goroutines at once (the way a
// client with a deep queue sends them), reach the members as full-stripe writes: each stripe is
// written out once full, whole, with no member read.
func TestBatching(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	for _, mode := range ioModes[:3] {
		t.Run(mode.name, func(t *testing.T) {
			const chunk, stripes = 64 << 10, 40
			// A full stripe is written out at once, a partial one when no write reached it for
			// WriteBackDelay: never here, as a stall of the writers of any length (the race
			// detector on a busy machine stalled them past 50 ms, then past 250 ms) would
			// otherwise count as the stream having stopped, and write its stripe out in part.
			io := mode.io
			io.WriteBackDelay = never
			a, ms := newCached(t, 4, chunk, stripes, raid.AssembleOptions{IOOptions: io})
			l := a.Layout()
			total := stripes * l.StripeSize()
			const unit = 4 << 10
			var next atomic.Int64
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					rng := newRand(uint64(g))
					buf := make([]byte, unit)
					for {
						off := next.Add(unit) - unit
						if off >= total {
							return
						}
						fill(rng, buf)
						binaryPut(buf, off)
						var err error
						if mode.pinned {
							_, err = a.WritePinned(bytes.Clone(buf), off, func() {})
						} else {
							_, err = a.WriteAt(buf, off)
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			// Each stripe goes out once full, without waiting for the delay or a Flush.
			for deadline := time.Now().Add(30 * time.Second); a.Counters().FullStripeWrites < stripes; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d full stripes written out 30 s after the last write", a.Counters().FullStripeWrites, stripes)
				}
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			c := a.Counters()
			t.Logf("%+v", c)
			if c.MemberBytesRead != 0 || c.FullStripeWrites != stripes {
				t.Errorf("member reads %d bytes and %d full-stripe write-outs for %d stripes written whole: want none and one each", c.MemberBytesRead, c.FullStripeWrites, stripes)
			}
			got := make([]byte, unit)
			for off := int64(0); off < total; off += unit {
				if _, err := a.ReadAt(got, off); err != nil || binaryGet(got) != off {
					t.Fatalf("unit at %d reads as unit %d, %v", off, binaryGet(got), err)
				}
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if bad := badStripes(ms, l); len(bad) > 0 {
				t.Fatalf("stale parity in stripes %v", bad)
			}
		})
	}
}

func binaryPut(b []byte, v int64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func binaryGet(b []byte) int64 {
	var v int64
	for i := range 8 {
		v |= int64(b[i]) << (8 * i)
	}
	return v
}

// TestReadYourWrites: goroutines write their own units of shared stripes and read each write
// back at once, while the cache (four stripes) writes out, evicts and writes through under
// them; every read must see the write just acknowledged. Units are whole, partial or several.
func TestReadYourWrites(t *testing.T) {
	for _, mode := range ioModes[:4] {
		t.Run(mode.name, func(t *testing.T) {
			const chunk, stripes, workers = 8 << 10, 12, 4
			io := mode.io
			io.StripeCache, io.WriteBackDelay = 4, 200*time.Microsecond
			a, ms := newCached(t, 4, chunk, stripes, raid.AssembleOptions{IOOptions: io})
			size := mustSize(a)
			model := make([]byte, size)
			const unit = 4 << 10
			units := size / unit
			var wg sync.WaitGroup
			for g := range int64(workers) {
				wg.Go(func() {
					rng := newRand(uint64(g) + 7)
					for range 300 {
						u := g + rng.Int64N(units/workers)*workers // one of mine
						off, n := u*unit, int64(unit)
						switch rng.IntN(3) {
						case 0: // a piece of the unit
							off += rng.Int64N(unit)
							n = 1 + rng.Int64N(u*unit+unit-off)
						case 1: // the whole unit, via the cache's reference path when pinned
						}
						p := make([]byte, n)
						fill(rng, p)
						var err error
						if mode.pinned {
							_, err = a.WritePinned(p, off, func() {})
						} else {
							_, err = a.WriteAt(p, off)
						}
						if err != nil {
							t.Error(err)
							return
						}
						copy(model[off:], p)
						got := make([]byte, unit)
						if _, err := a.ReadAt(got, u*unit); err != nil {
							t.Error(err)
							return
						}
						if i := firstDiff(got, model[u*unit:(u+1)*unit]); i < unit {
							t.Errorf("read of unit %d right after a write differs at byte %d", u, i)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			compareArray(t, a, model)
			c := a.Counters()
			t.Logf("%+v", c)
			if c.CacheHits == 0 || c.CacheEvictions == 0 {
				t.Errorf("want cache hits and evictions: %+v", c)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
				t.Fatalf("stale parity in stripes %v", bad)
			}
		})
	}
}

// TestWriteDuringWriteOut: a write to units whose stripe is being written out (the member
// write paused) is neither lost nor left out of parity, and reads see it at once.
func TestWriteDuringWriteOut(t *testing.T) {
	for _, mode := range ioModes[:3] {
		t.Run(mode.name, func(t *testing.T) {
			const C = 4 << 10
			ms := newMems("w", 4, raid.DataOffset+8*C)
			ps := make([]*pauser, len(ms))
			hooked := make([]raid.Member, len(ms))
			for i, m := range ms {
				ps[i] = &pauser{Member: m}
				hooked[i] = ps[i]
			}
			io := mode.io
			io.WriteBackDelay = never
			a, err := raid.CreateMembers(hooked, raid.CreateOptions{Chunk: C, IOOptions: io})
			if err != nil {
				t.Fatal(err)
			}
			l := a.Layout()
			write := func(p []byte, off int64) error {
				if mode.pinned {
					_, err := a.WritePinned(p, off, func() {})
					return err
				}
				_, err := a.WriteAt(p, off)
				return err
			}
			old, newer := bytes.Repeat([]byte{1}, C), bytes.Repeat([]byte{2}, C)
			off := int64(C) // data chunk 1 of stripe 0
			if err := write(old, off); err != nil {
				t.Fatal(err)
			}
			paused, resume := ps[l.Map(off).Member].arm(5 * time.Second)
			flushed := make(chan error, 1)
			go func() { flushed <- a.Flush() }()
			<-paused
			wrote := make(chan error, 1)
			go func() { wrote <- write(newer, off) }()
			time.Sleep(10 * time.Millisecond) // let the new write reach the stripe
			close(resume)
			if err := <-flushed; err != nil {
				t.Fatal(err)
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			got := make([]byte, C)
			if _, err := a.ReadAt(got, off); err != nil || !bytes.Equal(got, newer) {
				t.Fatalf("read after the racing write: %v, equal %v", err, bytes.Equal(got, newer))
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if got := memberData(ms, l, off, C); !bytes.Equal(got, newer) {
				t.Fatal("the member holds the older write")
			}
			if bad := badStripes(ms, l); len(bad) > 0 {
				t.Fatalf("stale parity in stripes %v", bad)
			}
		})
	}
}

// TestPinnedRelease: WritePinned runs release exactly once, after the last member write that
// reads the buffer — at once for writes it copies or writes whole, after the write-out for
// units it keeps, when a later write or a trim makes the kept units obsolete, and on errors.
func TestPinnedRelease(t *testing.T) {
	const C = 8 << 10
	a, _ := newCached(t, 3, C, 8, raid.AssembleOptions{IOOptions: raid.IOOptions{StablePages: true, WriteBackDelay: never}})
	ss := a.Layout().StripeSize()
	type counter struct{ n atomic.Int32 }
	pinned := func(p []byte, off int64) (*counter, error) {
		c := new(counter)
		_, err := a.WritePinned(p, off, func() { c.n.Add(1) })
		return c, err
	}
	want := func(c *counter, n int32, what string) {
		t.Helper()
		if got := c.n.Load(); got != n {
			t.Fatalf("%s: release ran %d times, want %d", what, got, n)
		}
	}
	buf := func(n int64) []byte { p := make([]byte, n); fill(newRand(uint64(n)), p); return p }

	c, err := pinned(buf(ss), 0)
	if err != nil {
		t.Fatal(err)
	}
	want(c, 1, "whole stripe, on return")
	c, _ = pinned(buf(100), ss+10)
	want(c, 1, "unaligned piece (copied), on return")
	c, _ = pinned(buf(2*stripe.UnitSize), ss)
	want(c, 0, "two kept units, on return")
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	want(c, 1, "two kept units, after Flush")

	c, _ = pinned(buf(stripe.UnitSize), 2*ss)
	if _, err := a.WriteAt(make([]byte, stripe.UnitSize), 2*ss); err != nil {
		t.Fatal(err)
	}
	want(c, 1, "kept unit overwritten")
	c, _ = pinned(buf(stripe.UnitSize), 3*ss)
	c2, _ := pinned(buf(stripe.UnitSize), 3*ss)
	want(c, 1, "kept unit overwritten by a pinned write")
	want(c2, 0, "the pinned overwrite, kept")
	if err := a.Trim(3*ss, ss); err != nil {
		t.Fatal(err)
	}
	want(c2, 1, "kept unit trimmed")

	c, err = pinned(buf(10), mustSize(a))
	if !errors.Is(err, raid.ErrOutOfRange) {
		t.Fatalf("out of range: %v", err)
	}
	want(c, 1, "out of range")
	c, _ = pinned(buf(stripe.UnitSize), 4*ss)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	want(c, 1, "kept unit, after Close")
	c, err = pinned(buf(10), 0)
	if !errors.Is(err, raid.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	want(c, 1, "closed array")
}

// TestWriteOutError: a member write error during a background write-out marks the member
// faulty and the write-out completes degraded: Flush succeeds, the data reads back, and the
// other members alone hold it (assembled without the faulty one).
func TestWriteOutError(t *testing.T) {
	const C = 4 << 10
	ms := newMems("f", 3, raid.DataOffset+8*C)
	a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: C})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	fs := make([]*raidtest.Faulty, len(ms))
	for i, m := range ms {
		m.Reopen()
		fs[i] = raidtest.NewFaulty(m)
	}
	var logs recorder
	a, err = raid.AssembleMembers(asMembers(fs), raid.AssembleOptions{Logger: slog.New(&logs),
		IOOptions: raid.IOOptions{WriteBackDelay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	loc := a.Layout().Map(0)
	fs[loc.Member].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
	p := bytes.Repeat([]byte{7}, 100)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); a.Status().State != raid.StateDegraded; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the member was not marked faulty after its write-out failed")
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatalf("Flush after a failed write-out: %v; want the write-out done degraded", err)
	}
	got := make([]byte, len(p))
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read: %v, equal %v", err, bytes.Equal(got, p))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	var rest []raid.Member
	for i, m := range ms {
		if i != loc.Member {
			m.Reopen()
			rest = append(rest, m)
		}
	}
	a, err = raid.AssembleMembers(rest, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read from the others alone: %v, equal %v", err, bytes.Equal(got, p))
	}
}

// TestFUA: WriteAtFUA writes out the stripes it touched and syncs before it returns.
func TestFUA(t *testing.T) {
	const C = 4 << 10
	ms := newMems("c", 3, raid.DataOffset+8*C)
	createClosed(t, ms, raid.CreateOptions{Chunk: C, BitmapRegion: 2 * C}) // a region per stripe
	a, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{IOOptions: raid.IOOptions{WriteBackDelay: never}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := bytes.Repeat([]byte{9}, 3*C/2)
	off := a.Layout().StripeSize() - C/2               // across two stripes
	if _, err := a.WriteAt([]byte{1}, 0); err != nil { // the first write marks the array dirty, with syncs
		t.Fatal(err)
	}
	syncs, flushes := ms[0].Syncs(), a.Status().Bitmap.Flushes
	if _, err := a.WriteAtFUA(p, off); err != nil {
		t.Fatal(err)
	}
	// One sync for the FUA write, one for each write-intent bitmap write (2 stripes written out:
	// 2 regions of one stripe each set, each bit synced before its stripe is written).
	bf := a.Status().Bitmap.Flushes - flushes
	if ms[0].Syncs() != syncs+1+int(bf) || bf != 2 {
		t.Fatalf("syncs %d → %d with %d bitmap writes, want one more than those (and 2 of them)", syncs, ms[0].Syncs(), bf)
	}
	got := append(bytes.Clone(memberData(ms, a.Layout(), off, C/2)), memberData(ms, a.Layout(), off+C/2, C)...)
	if !bytes.Equal(got, p) {
		t.Fatal("a FUA write is not on the members when it returns")
	}
	if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
		t.Fatalf("stale parity in stripes %v", bad)
	}
}

// TestOverlapStress: goroutines write overlapping random runs of whole units, through
// WritePinned when the mode pins (buffers scribbled over on release), while the cache writes
// out and evicts under them. Afterwards every unit holds one of the versions written to it
// (a unit is never torn or stale-mixed) and every stripe's parity is right.
func TestOverlapStress(t *testing.T) {
	for _, mode := range ioModes[:4] {
		t.Run(mode.name, func(t *testing.T) {
			const chunk, stripes, workers, unit = 8 << 10, 8, 6, stripe.UnitSize
			io := mode.io
			if io.StripeCache == 0 {
				io.StripeCache = 4
			}
			io.WriteBackDelay = 100 * time.Microsecond
			a, ms := newCached(t, 4, chunk, stripes, raid.AssembleOptions{IOOptions: io})
			units := mustSize(a) / unit
			var mu sync.Mutex // guards versions
			versions := make([]map[uint64]bool, units)
			var outstanding sync.WaitGroup
			var wg sync.WaitGroup
			for g := range workers {
				wg.Go(func() {
					rng := newRand(uint64(g) + 40)
					for range 250 {
						u := rng.Int64N(units)
						n := min(units-u, 1+rng.Int64N(6))
						p := make([]byte, n*unit)
						fill(rng, p)
						mu.Lock()
						for i := range n {
							if versions[u+i] == nil {
								versions[u+i] = map[uint64]bool{}
							}
							versions[u+i][unitKey(p[i*unit:(i+1)*unit])] = true
						}
						mu.Unlock()
						var err error
						if mode.pinned {
							outstanding.Add(1)
							_, err = a.WritePinned(p, u*unit, func() {
								for i := range p {
									p[i] = 0xee
								}
								outstanding.Done()
							})
						} else {
							_, err = a.WriteAt(p, u*unit)
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			outstanding.Wait()
			got := make([]byte, unit)
			for u := range units {
				if _, err := a.ReadAt(got, u*unit); err != nil {
					t.Fatal(err)
				}
				v := unitKey(got)
				if versions[u] == nil && v != unitKey(make([]byte, unit)) || versions[u] != nil && !versions[u][v] {
					t.Fatalf("unit %d holds a version never written to it (torn, stale or scribbled)", u)
				}
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
				t.Fatalf("stale parity in stripes %v", bad)
			}
		})
	}
}

// unitKey identifies a unit's whole contents: CRC-32 and the first 8 bytes.
func unitKey(b []byte) uint64 { return uint64(crc32.ChecksumIEEE(b))<<32 ^ uint64(binaryGet(b)) }

// TestJournalBatchFits: a large aligned write to an array whose journal has the smallest size
// it accepts (JournalMinSize) succeeds and reads back, with and without write-back caching:
// the cache's batch of whole stripes, one journal record, must fit the journal's ring (it
// once took up to 1 MiB of data at once and failed with ErrJournal).
func TestJournalBatchFits(t *testing.T) {
	for _, chunk := range []int64{4 << 10, 64 << 10} {
		for _, stripes := range []int{0, -1} {
			t.Run(fmt.Sprintf("chunk%dK-StripeCache=%d", chunk>>10, stripes), func(t *testing.T) {
				l, err := stripe.NewLayout(4, chunk, stripe.DefaultAlgorithm)
				if err != nil {
					t.Fatal(err)
				}
				ms := newMems("jb", 4, raid.DataOffset+64*chunk)
				jm := raidtest.NewMem("/nonexistent/jb-journal", raid.JournalMinSize(l))
				a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: chunk, Consistency: raid.ConsistencyJournal,
					Journal: jm, IOOptions: raid.IOOptions{StripeCache: stripes}})
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close()
				want := make([]byte, mustSize(a))
				fill(newRand(uint64(chunk)), want)
				if _, err := a.WriteAt(want, 0); err != nil {
					t.Fatalf("writing %d bytes: %v", len(want), err)
				}
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(want))
				if _, err := a.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatal("the array reads back other bytes than were written")
				}
			})
		}
	}
}

// TestSmallWritesFUA: sequential small writes (4 KiB, 512 bytes, 12 KiB not aligned to units)
// with a FUA write wherever a stripe's first chunk is complete, as a filesystem's commit in the
// middle of a stream does: each stripe reaches the members in two write-outs, its first chunk
// with parity (FUA), then the rest with parity, at most 5/3 member bytes written per client
// byte with 3 data chunks (and a unit more per stripe for the unaligned writes). The FUA
// write-out reads the rest of the stripe in, so the head is all up to date but only partly
// dirty after it; the later writes must join it rather than each go out alone as it comes (2.0
// per client byte for 4 KiB writes, about 11 for 512-byte ones). Every byte is checked after.
func TestSmallWritesFUA(t *testing.T) {
	for _, mode := range ioModes[:3] {
		for _, w := range []struct {
			name        string
			size, start int64
		}{{"4k", 4 << 10, 0}, {"512", 512, 0}, {"12k-unaligned", 12 << 10, 2 << 10}} {
			t.Run(mode.name+"-"+w.name, func(t *testing.T) {
				const chunk, stripes = 64 << 10, 16
				io := mode.io
				io.WriteBackDelay = never // only the FUA writes, whole stripes and Flush write heads out
				a, ms := newCached(t, 4, chunk, stripes, raid.AssembleOptions{IOOptions: io})
				l := a.Layout()
				ss := l.StripeSize()
				model := make([]byte, mustSize(a))
				rng := newRand(uint64(w.size))
				before := a.Counters()
				var client int64
				fua := make([]bool, stripes)
				for off := w.start; off+w.size <= stripes*ss; off += w.size {
					p := model[off : off+w.size]
					fill(rng, p)
					end := off + w.size
					s := (end - 1) / ss
					var err error
					switch {
					case !fua[s] && end-s*ss >= chunk:
						fua[s] = true
						_, err = a.WriteAtFUA(p, off)
					case mode.pinned:
						_, err = a.WritePinned(bytes.Clone(p), off, func() {})
					default:
						_, err = a.WriteAt(p, off)
					}
					if err != nil {
						t.Fatal(err)
					}
					client += w.size
				}
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				c := a.Counters()
				got := float64(c.MemberBytesWritten-before.MemberBytesWritten) / float64(client)
				t.Logf("member bytes written per client byte %.3f, read %.3f: %d full, %d RCW, %d RMW write-outs", got,
					float64(c.MemberBytesRead-before.MemberBytesRead)/float64(client), c.FullStripeWrites, c.RCWWrites, c.RMWWrites)
				if bound := 5.0/3 + 2.0*stripe.UnitSize/float64(ss); got > bound {
					t.Errorf("%.3f member bytes written per client byte, want at most %.3f", got, bound)
				}
				compareArray(t, a, model)
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
				if bad := badStripes(ms, l); len(bad) > 0 {
					t.Fatalf("stale parity in stripes %v", bad)
				}
			})
		}
	}
}

// TestWriteAllocs: in steady state a small write allocates nothing, its write-out included:
// random 4 KiB writes (copied, and pinned with stable pages) and 512-byte ones (their unit read
// in first) through a small cache whose write-out goroutines take them as they come (a 1 µs
// write-back delay, and more than half the heads dirty) or that writes them through (no head
// free), with every write-intent bit already set (the cleaner stopped: setting a bit writes the
// bitmap, which allocates). The count covers every goroutine. A few allocations per run of
// 2000 writes are allowed (a Pin or workspace more when more are out at once than ever
// before: on a loaded machine the write-outs fall behind and more are out, and 4k-pinned once
// took 5 where 4 were allowed); an allocation per write or per write-out makes a thousand or
// more.
func TestWriteAllocs(t *testing.T) {
	if invariantsEnabled {
		t.Skip("the invariants build re-reads every stripe it writes: reads and allocations are not counted")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items: allocations are not counted")
	}
	for _, w := range []struct {
		name           string
		size           int64
		pinned, cached bool
	}{{"4k", 4 << 10, false, false}, {"4k-pinned", 4 << 10, true, false}, {"4k-cached", 4 << 10, false, true},
		{"4k-pinned-cached", 4 << 10, true, true}, {"512", 512, false, false}} {
		t.Run(w.name, func(t *testing.T) {
			io := raid.IOOptions{StripeCache: 16, WriteBackDelay: time.Microsecond, StablePages: w.pinned}
			a, _ := newCached(t, 4, 16<<10, 64, raid.AssembleOptions{IOOptions: io})
			defer a.Close()
			raid.StopBitmapCleaner(a)
			rng := newRand(uint64(w.size))
			p := make([]byte, w.size)
			fill(rng, p)
			n := mustSize(a) / w.size
			release := func() {}
			write := func() {
				off := rng.Int64N(n) * w.size
				var err error
				if w.cached {
					var rel func()
					if w.pinned {
						rel = release
					}
					if a.WriteCached(p, off, rel) {
						return
					}
				}
				if w.pinned {
					_, err = a.WritePinned(p, off, release)
				} else {
					_, err = a.WriteAt(p, off)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			// Warm up: every bitmap region written, every head bound, the free lists filled.
			if _, err := a.WriteAt(make([]byte, mustSize(a)), 0); err != nil {
				t.Fatal(err)
			}
			for range 20000 {
				write()
			}
			// No GC during the count: it would empty the array's sync.Pools (its member I/O
			// batches), which then allocate again; the cache's own free lists survive one
			// (TestAllocsAfterGC, package stripe/cache).
			defer debug.SetGCPercent(debug.SetGCPercent(-1))
			before := a.Counters()
			const writes, runs, most = 2000, 5, 20
			allocs := testing.AllocsPerRun(runs, func() {
				for range writes {
					write()
				}
			})
			c := a.Counters()
			outs := c.RMWWrites + c.RCWWrites + c.FullStripeWrites - before.RMWWrites - before.RCWWrites - before.FullStripeWrites
			t.Logf("%v allocations per %d writes; %d write-outs during the runs (%d written through)", allocs, writes, outs, c.WriteThroughs-before.WriteThroughs)
			if outs < writes {
				t.Fatalf("only %d write-outs during %d writes: the write-outs were not measured", outs, (runs+1)*writes)
			}
			if allocs > most {
				t.Errorf("%v allocations per %d writes and their write-outs, want at most %d", allocs, writes, most)
			}
		})
	}
}

// TestWriteCached: the array takes a write of whole units within a stripe into its cache
// (WriteCached) once it is marked dirty, and the data is read back, written out and survives
// reassembly byte for byte; it declines, writing nothing, before the array is marked dirty (that
// takes a superblock write), for a whole stripe, without a cache, and once the array has failed.
func TestWriteCached(t *testing.T) {
	a, fs, ms, model := faultyArray(t, 4, 16, raid.AssembleOptions{IOOptions: raid.IOOptions{WriteBackDelay: time.Millisecond}})
	ss := a.Layout().StripeSize()
	p := bytes.Repeat([]byte{0x5A}, 4096)
	if a.WriteCached(p, 0, nil) {
		t.Fatal("WriteCached before the array was marked dirty")
	}
	if _, err := a.WriteAt(p, ss); err != nil { // marks it dirty
		t.Fatal(err)
	}
	copy(model[ss:], p)
	if a.WriteCached(make([]byte, ss), 0, nil) {
		t.Fatal("WriteCached of a whole stripe")
	}
	rng := newRand(9)
	cached := 0
	for range 200 {
		off := rng.Int64N(int64(len(model))/4096) * 4096
		q := make([]byte, 4096*(1+rng.Int64N(2)))
		fill(rng, q)
		if off+int64(len(q)) > int64(len(model)) || !a.WriteCached(q, off, nil) {
			continue
		}
		cached++
		copy(model[off:], q)
		clear(q) // not kept
	}
	if cached < 100 {
		t.Fatalf("only %d of 200 writes were cached", cached)
	}
	compareArray(t, a, model)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if bad := badStripes(ms, a.Layout()); len(bad) > 0 {
		t.Fatalf("stripes %v: parity is not the XOR of the data", bad)
	}
	for i, m := range ms {
		m.Reopen()
		fs[i] = raidtest.NewFaulty(m)
	}
	b, err := raid.AssembleMembers(asMembers(fs), raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	compareArray(t, b, model)
	if _, err := b.WriteAt(p, ss); err != nil {
		t.Fatal(err)
	}
	if err := b.Fail("1"); err != nil {
		t.Fatal(err)
	}
	fs[3].Inject(raidtest.Fault{Op: raidtest.OpWrite, Off: raid.DataOffset, Len: 1 << 40})
	if _, err := b.WriteAtFUA(make([]byte, ss), 0); !errors.Is(err, raid.ErrArrayFailed) {
		t.Fatalf("write that fails a second member: %v; want ErrArrayFailed", err)
	}
	if b.WriteCached(p, 0, nil) {
		t.Fatal("WriteCached into a failed array")
	}
	c, _ := newCached(t, 4, 16<<10, 16, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	defer c.Close()
	if _, err := c.WriteAt(p, ss); err != nil {
		t.Fatal(err)
	}
	if c.WriteCached(p, 0, nil) {
		t.Fatal("WriteCached without a cache")
	}
}
