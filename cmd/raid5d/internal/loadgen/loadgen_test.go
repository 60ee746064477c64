package loadgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, unit := range []int{512, 4096} {
		p := NewPool(64*unit, unit, 7)
		buf := make([]byte, 3*unit)
		h := Header{Gen: 9, Offset: 1 << 40, Seed: 0xfeed, Writer: 3}
		next := p.Fill(buf, p.Units()-1, h) // wraps around the end of the pool
		if next != 2 {
			t.Errorf("unit %d: Fill returned position %d, want 2", unit, next)
		}
		for k := range 3 {
			u := buf[k*unit : (k+1)*unit]
			got, err := DecodeHeader(u)
			want := h
			want.Offset += int64(k * unit)
			if err != nil || got != want {
				t.Errorf("unit %d, #%d: %+v, %v; want %+v", unit, k, got, err, want)
			}
			// The precomputed payload CRC gives the same header as computing it in full.
			again := bytes.Clone(u)
			PutHeader(again, want)
			if !bytes.Equal(again, u) {
				t.Errorf("unit %d, #%d: PutHeader differs from Pool.Fill", unit, k)
			}
		}
		// Stamp rewrites the headers in place in the pool, to the same bytes Fill copies out.
		st := p.Stamp(p.Units()-1, unit, h)
		if !bytes.Equal(st, buf[:unit]) || &st[0] != &p.data[(p.Units()-1)*unit] {
			t.Errorf("unit %d: Stamp differs from Fill, or does not return the pool's own bytes", unit)
		}
		if bytes.Equal(buf[HeaderSize:unit], buf[unit+HeaderSize:2*unit]) {
			t.Errorf("unit %d: consecutive units carry the same payload", unit)
		}
	}
}

// TestChecksumCatchesEveryByte flips each byte of a unit in turn: every change is caught.
func TestChecksumCatchesEveryByte(t *testing.T) {
	unit := make([]byte, 4096)
	NewPool(1<<16, 4096, 1).Fill(unit, 5, Header{Gen: 1, Offset: 8192, Seed: 2})
	for i := range unit {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			unit[i] ^= x
			if _, err := DecodeHeader(unit); !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrNoHeader) {
				t.Fatalf("byte %d ^ %#x not detected: %v", i, x, err)
			}
			unit[i] ^= x
		}
	}
	if _, err := DecodeHeader(unit); err != nil {
		t.Fatalf("restored unit: %v", err)
	}
	if _, err := DecodeHeader(make([]byte, 4096)); !errors.Is(err, ErrNoHeader) {
		t.Errorf("zero unit: %v, want ErrNoHeader", err)
	}
}

func baseConfig(mode Mode, size int64) Config {
	return Config{Mode: mode, BlockSize: 4096, IODepth: 8, DeviceSize: size, Seed: 42, PoolSize: 1 << 20}
}

func devs(d Device, n int) []Device {
	out := make([]Device, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// TestVerify writes a region (sequentially with 16K blocks, randomly with 4K blocks from two
// jobs, and mixed), reads it back, and checks every unit is as written.
func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		mode Mode
		bs   int
	}{{Write, 16384}, {RandWrite, 4096}, {RW, 4096}, {RandWrite, 1024}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			const size = 4 << 20
			d := newCrashDev(size)
			cfg := baseConfig(tc.mode, size)
			cfg.BlockSize, cfg.Verify = tc.bs, true
			res, err := Run(context.Background(), cfg, devs(d, 2))
			if err != nil {
				t.Fatal(err)
			}
			v := res.Verify
			if v == nil || v.Mismatches != 0 || v.Written == 0 || v.Units < size/int64(Unit(tc.bs)) {
				t.Fatalf("verify %+v: want every unit checked, some written this run, none wrong", v)
			}
			if res.WriteIOs == 0 || res.Lat.Count != uint64(res.ReadIOs+res.WriteIOs) {
				t.Errorf("writes %d, latencies %d for %d I/Os", res.WriteIOs, res.Lat.Count, res.ReadIOs+res.WriteIOs)
			}
			// A later read-only pass of another run accepts the blocks as an earlier run's.
			cfg = baseConfig(Read, size)
			cfg.BlockSize, cfg.Verify, cfg.Seed = tc.bs, true, 43
			res, err = Run(context.Background(), cfg, devs(d, 1))
			if err != nil || res.Verify.Previous+res.Verify.Zero != size/int64(Unit(tc.bs)) {
				t.Fatalf("read pass: %v, verify %+v", err, res.Verify)
			}
		})
	}
}

// TestVerifyCatches: a corrupted byte and a block read from the wrong place are reported, with
// their offsets.
func TestVerifyCatches(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name  string
		hook  func(p []byte, off int64, d *crashDev)
		found string
	}{
		{"corrupt byte", func(p []byte, off int64, d *crashDev) {
			if off == 40960 {
				p[1000] ^= 4
			}
		}, "checksum mismatch"},
		{"misplaced block", func(p []byte, off int64, d *crashDev) {
			if off == 40960 {
				d.mu.Lock()
				copy(p, d.cur[8192:])
				d.mu.Unlock()
			}
		}, "misplaced block: header offset 8192"},
		{"stale generation", func(p []byte, off int64, d *crashDev) {
			if off == 40960 {
				h, _ := DecodeHeader(p)
				h.Gen--
				PutHeader(p, h)
			}
		}, "gen 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newCrashDev(size)
			cfg := baseConfig(Write, size)
			cfg.Verify = true
			// The write pass reads nothing; the read-back that follows is what the hook spoils.
			d.readHook = func(p []byte, off int64) { tc.hook(p, off, d) }
			res, err := Run(context.Background(), cfg, devs(d, 1))
			if !errors.Is(err, ErrVerify) {
				t.Fatalf("err %v, want ErrVerify", err)
			}
			v := res.Verify
			if v.Mismatches != 1 || len(v.First) != 1 || v.First[0].Offset != 40960 || !strings.Contains(v.First[0].Found, tc.found) {
				t.Fatalf("mismatches %d %+v, want one at 40960 finding %q", v.Mismatches, v.First, tc.found)
			}
		})
	}
}

func runLogged(t *testing.T, d Device, cfg Config) string {
	t.Helper()
	cfg.VerifyLog = filepath.Join(t.TempDir(), "vlog")
	if _, err := Run(context.Background(), cfg, devs(d, 2)); err != nil {
		t.Fatal(err)
	}
	return cfg.VerifyLog
}

func readLog(t *testing.T, path string) *LogState {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := ReadLog(f)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestCrashCheck: a power cut that drops unflushed writes (tearing some between units) passes
// Check, with and without FUA, with one connection's flush covering the others or not.
func TestCrashCheck(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fua       bool
		multiConn bool
		bs        int
	}{
		{"flush multi-conn", false, true, 4096},
		{"flush per-conn", false, false, 4096},
		{"fua", true, false, 4096},
		{"flush torn 16K", false, true, 16384},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 2 << 20
			rng := rand.New(rand.NewPCG(1, 2))
			d := newCrashDev(size)
			// Some contents from before the run, which unwritten blocks must keep.
			for i := range d.cur[:size/2] {
				d.cur[i] = byte(rng.Uint32())
			}
			copy(d.durable, d.cur)
			cfg := baseConfig(RandWrite, size)
			cfg.BlockSize, cfg.FUA, cfg.MultiConn, cfg.FlushEvery, cfg.Time = tc.bs, tc.fua, tc.multiConn, 16, 0
			path := runLogged(t, d, cfg)
			st := readLog(t, path)
			for range 3 {
				res, err := Check(context.Background(), d.crash(rng), st, 4, 10)
				if err != nil {
					t.Fatalf("%v: %+v", err, res)
				}
				if res.Durable == 0 || res.Written == 0 || res.Written == res.Blocks || res.Unchanged == 0 {
					t.Errorf("%+v: want some blocks durable, some written, some not", res)
				}
				if tc.fua && res.Durable != res.Written {
					t.Errorf("FUA: %d durable of %d written", res.Durable, res.Written)
				}
			}
			// The device as it stands (nothing lost) passes too, every written unit at its last
			// generation.
			res, err := Check(context.Background(), d, st, 4, 10)
			if err != nil || res.Latest != res.Written*int64(tc.bs/Unit(tc.bs)) {
				t.Fatalf("uncrashed: %v, %+v", err, res)
			}
		})
	}
}

// TestCheckFindsLoss: a device that drops flushed writes, and one whose unwritten block changed,
// fail Check with violations at the right offsets.
func TestCheckFindsLoss(t *testing.T) {
	const size = 1 << 20
	rng := rand.New(rand.NewPCG(3, 4))
	d := newCrashDev(size)
	d.loseFlushed = true
	cfg := baseConfig(Write, size)
	cfg.FlushEvery, cfg.Time = 8, 0
	st := readLog(t, runLogged(t, d, cfg))
	res, err := Check(context.Background(), d.crash(rng), st, 4, 1000)
	if !errors.Is(err, ErrViolation) || res.Violations == 0 || res.Violations != int64(len(res.First)) {
		t.Fatalf("lossy device: %v, %+v; want violations", err, res)
	}
	for _, m := range res.First {
		if !slices.Contains(d.lost, m.Offset) || !strings.Contains(m.Found, "zeroes") {
			t.Errorf("violation %v is not a lost flushed write %v", m, d.lost)
		}
	}

	// A block the run never wrote must keep its old contents.
	d = newCrashDev(size)
	cfg = baseConfig(RandWrite, size)
	cfg.Time, cfg.FlushEvery = 0, 4
	cfg.IODepth = 1
	st = readLog(t, runLogged(t, d, cfg))
	var untouched int64 = -1
	for b, m := range st.Max {
		if m == 0 {
			untouched = int64(b)
			break
		}
	}
	if untouched < 0 {
		t.Fatal("every block was written; cannot test an unwritten one")
	}
	d.cur[untouched*4096+77] = 1
	res, err = Check(context.Background(), d, st, 4, 10)
	if !errors.Is(err, ErrViolation) || res.Violations != 1 || res.First[0].Offset != untouched*4096 ||
		!strings.Contains(res.First[0].Expected, "never written") {
		t.Fatalf("changed unwritten block: %v, %+v", err, res)
	}
}

func TestReadLogDamage(t *testing.T) {
	d := newCrashDev(256 << 10)
	cfg := baseConfig(RandWrite, 256<<10)
	cfg.Time, cfg.FlushEvery = 0, 4
	path := runLogged(t, d, cfg)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	full, err := ReadLog(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	torn, err := ReadLog(bytes.NewReader(raw[:len(raw)-5]))
	if err != nil || torn.TornBytes != recSize-5 || torn.Records != full.Records-1 {
		t.Errorf("torn log: %v, %d torn bytes, %d records of %d", err, torn.TornBytes, torn.Records, full.Records)
	}
	bad := bytes.Clone(raw)
	bad[len(bad)-recSize] = 99
	if _, err := ReadLog(bytes.NewReader(bad)); !errors.Is(err, ErrBadLog) {
		t.Errorf("unknown record kind: %v, want ErrBadLog", err)
	}
	if _, err := ReadLog(strings.NewReader("not a log at all")); !errors.Is(err, ErrBadLog) {
		t.Errorf("not a log: %v, want ErrBadLog", err)
	}
}

func TestConfigErrors(t *testing.T) {
	d := newCrashDev(1 << 20)
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"bs not 512-aligned", func(c *Config) { c.BlockSize = 1000 }},
		{"bs above 4K not 4K-aligned", func(c *Config) { c.BlockSize = 6144 }},
		{"offset misaligned", func(c *Config) { c.Offset = 512 }},
		{"region past end", func(c *Config) { c.Size = 2 << 20 }},
		{"too few blocks to verify", func(c *Config) { c.Verify, c.Size = true, 8*4096 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(Write, 1<<20)
			tc.mod(&cfg)
			if _, err := Run(context.Background(), cfg, devs(d, 1)); !errors.Is(err, ErrConfig) {
				t.Errorf("got %v, want ErrConfig", err)
			}
		})
	}
}

func TestHistogram(t *testing.T) {
	var h Histogram
	vals := make([]time.Duration, 0, 100000)
	rng := rand.New(rand.NewPCG(5, 6))
	for range cap(vals) {
		v := time.Duration(rng.ExpFloat64() * 100e3) // ~100µs mean
		vals = append(vals, v)
		h.Record(v)
	}
	slices.Sort(vals)
	for _, q := range []float64{.5, .9, .99, .999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := h.Quantile(q)
		if got < exact || float64(got) > float64(exact)*1.04+1 {
			t.Errorf("q%v: %v, exact %v (want within +4%%)", q, got, exact)
		}
	}
	if h.Summary().Max != vals[len(vals)-1] {
		t.Errorf("max %v, want %v", h.Summary().Max, vals[len(vals)-1])
	}
	for i := range histBuckets - 1 {
		if histIndex(histLow(i)) != i || histIndex(histHigh(i)) != i {
			t.Fatalf("bucket %d: [%d, %d] maps to %d, %d", i, histLow(i), histHigh(i), histIndex(histLow(i)), histIndex(histHigh(i)))
		}
	}
	if n := testing.AllocsPerRun(1000, func() { h.Record(12345) }); n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
}

func FuzzDecodeHeader(f *testing.F) {
	u := make([]byte, 512)
	NewPool(4096, 512, 1).Fill(u, 0, Header{Gen: 3, Offset: 4096, Seed: 9})
	f.Add(u)
	f.Add(make([]byte, 40))
	f.Add([]byte("R5BK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			if !errors.Is(err, ErrNoHeader) && !errors.Is(err, ErrChecksum) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		again := bytes.Clone(b)
		PutHeader(again, h)
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v, re-encoding differs", h)
		}
		_ = describe(b, h.Offset)
	})
}

// intentCheckDev fails a write whose intent record is not yet in the log file: the log must
// reach the kernel before the request does, so a generator killed mid-run leaves a log that
// names every value the device may hold.
type intentCheckDev struct {
	*crashDev
	t    *testing.T
	path string
	seen atomic.Int64
}

func (d *intentCheckDev) WriteAt(p []byte, off int64) (int, error) {
	h, err := DecodeHeader(p[:4096])
	if err != nil {
		d.t.Errorf("write at %d without a valid header: %v", off, err)
	}
	raw, _ := os.ReadFile(d.path)
	found := false
	for i := len(raw) - recSize; i >= 0 && !found; i -= recSize {
		r := raw[i : i+recSize]
		found = r[0] == recIntent && binary.LittleEndian.Uint32(r[4:8]) == h.Gen &&
			int64(binary.LittleEndian.Uint64(r[8:16])) == off/4096
	}
	if !found {
		d.t.Errorf("write of gen %d at %d sent before its intent was in the log file", h.Gen, off)
	}
	d.seen.Add(1)
	return d.crashDev.WriteAt(p, off)
}

func TestIntentBeforeWrite(t *testing.T) {
	const size = 256 << 10
	path := filepath.Join(t.TempDir(), "vlog")
	d := &intentCheckDev{crashDev: newCrashDev(size), t: t, path: path}
	cfg := baseConfig(RandWrite, size)
	cfg.Time, cfg.IODepth, cfg.VerifyLog = 0, 4, path
	if _, err := Run(context.Background(), cfg, []Device{d}); err != nil {
		t.Fatal(err)
	}
	if n := d.seen.Load(); n != size/4096 {
		t.Errorf("%d writes seen, want %d", n, size/4096)
	}
}
