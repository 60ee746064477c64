package loadgen

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Device is one connection to the device under test (an *client.Conn satisfies it). Its methods
// are called concurrently, IODepth at a time.
type Device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	WriteAtFUA(p []byte, off int64) (int, error)
	Flush() error
}

// Mode is the I/O pattern.
type Mode int

// The modes. RW is random, half reads and half writes.
const (
	Read Mode = iota
	Write
	RandRead
	RandWrite
	RW
)

var modeNames = [...]string{"read", "write", "randread", "randwrite", "rw"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode reads a mode name; ErrConfig for an unknown one.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown mode %q (read, write, randread, randwrite, rw)", ErrConfig, s)
}

func (m Mode) random() bool { return m == RandRead || m == RandWrite || m == RW }
func (m Mode) writes() bool { return m == Write || m == RandWrite || m == RW }

// ErrConfig is returned by Run and Check for a configuration they cannot run.
var ErrConfig = errors.New("loadgen: bad configuration")

// ErrVerify is returned by Run when --verify found a block that does not hold what it should.
var ErrVerify = errors.New("loadgen: verify failed")

// Config describes a run.
type Config struct {
	Mode      Mode
	BlockSize int // bytes per I/O: a multiple of 512, and of 4096 when 4096 or more
	IODepth   int // requests in flight per job
	// Time bounds the run; 0 means one pass: each job does (its share of the region)/BlockSize
	// I/Os (sequential modes: its slice of the region once).
	Time time.Duration
	// Offset and Size bound the region (Size 0: to the end of the device). Size is rounded down
	// to a whole number of blocks. Offset is a multiple of the unit (4096, or BlockSize if less).
	Offset, Size, DeviceSize int64
	// Verify checks every block read, and after a writing run reads the region back.
	Verify bool
	// FlushEvery sends a FLUSH after every FlushEvery writes of a job (0: never).
	FlushEvery int
	// FUA writes with NBD_CMD_FLAG_FUA.
	FUA bool
	// Seed keys the data pool and the offsets, and is written in every header.
	Seed uint64
	// VerifyLog, if set, is the path of the verify log (see ReadLog) to create.
	VerifyLog string
	// MultiConn says a FLUSH on one connection covers writes of all (CAN_MULTI_CONN).
	MultiConn bool
	// Target names the device, for the verify log.
	Target string
	// PoolSize is the data pool size (0: DefaultPoolSize).
	PoolSize int
	// Progress, if set, is called about once a second during the main phase.
	Progress func(Progress)
	// MaxMismatches bounds the verify failures reported in detail (0: 10).
	MaxMismatches int
}

// Progress is a cumulative count during a run.
type Progress struct {
	Elapsed    time.Duration
	IOs, Bytes int64
}

// Mismatch is a unit that does not hold what it should.
type Mismatch struct {
	Offset   int64  `json:"offset"`
	Expected string `json:"expected"`
	Found    string `json:"found"`
}

func (m Mismatch) String() string {
	return fmt.Sprintf("offset %d: expected %s, found %s", m.Offset, m.Expected, m.Found)
}

// VerifyResult counts the units checked by --verify.
type VerifyResult struct {
	Units      int64 `json:"units"`
	Written    int64 `json:"written_this_run"`
	Zero       int64 `json:"zero"`
	Previous   int64 `json:"previous_run"`
	Mismatches int64 `json:"mismatches"`
	// First lists the first mismatches found.
	First           []Mismatch    `json:"first,omitempty"`
	ReadbackElapsed time.Duration `json:"readback_ns"`
}

// Result is the summary of a run.
type Result struct {
	Mode       string        `json:"rw"`
	BlockSize  int           `json:"bs"`
	IODepth    int           `json:"iodepth"`
	Jobs       int           `json:"jobs"`
	Offset     int64         `json:"offset"`
	Size       int64         `json:"size"`
	Seed       uint64        `json:"seed"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	ReadIOs    int64         `json:"read_ios"`
	WriteIOs   int64         `json:"write_ios"`
	ReadBytes  int64         `json:"read_bytes"`
	WriteBytes int64         `json:"write_bytes"`
	Flushes    int64         `json:"flushes"`
	MBps       float64       `json:"mb_per_s"` // 10^6 bytes per second, reads and writes
	IOPS       float64       `json:"iops"`
	Lat        Latency       `json:"lat"` // every READ and WRITE
	ReadLat    Latency       `json:"read_lat"`
	WriteLat   Latency       `json:"write_lat"`
	FlushLat   Latency       `json:"flush_lat"`
	Errors     int64         `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
	// CPU used by this process during the main phase (getrusage), and per 10^9 bytes moved.
	CPUUser     time.Duration `json:"cpu_user_ns"`
	CPUSys      time.Duration `json:"cpu_sys_ns"`
	CPUSecPerGB float64       `json:"cpu_s_per_gb"`
	Verify      *VerifyResult `json:"verify,omitempty"`
	VerifyLog   string        `json:"verify_log,omitempty"`
}

// Unit returns the header unit for a block size: 4096, or bs when smaller.
func Unit(bs int) int { return min(bs, MaxUnit) }

// checkGeometry validates block size and region and returns the region size.
func checkGeometry(bs int, off, size, devSize int64) (int64, error) {
	if bs < 512 || bs%512 != 0 || (bs > MaxUnit && bs%MaxUnit != 0) {
		return 0, fmt.Errorf("%w: block size %d: want a multiple of 512, and of 4096 above it", ErrConfig, bs)
	}
	unit := int64(Unit(bs))
	if off < 0 || off%unit != 0 || off >= devSize {
		return 0, fmt.Errorf("%w: offset %d: want a multiple of %d below the device size %d", ErrConfig, off, unit, devSize)
	}
	if size == 0 {
		size = devSize - off
	}
	size -= size % int64(bs)
	if size <= 0 || size > devSize-off {
		return 0, fmt.Errorf("%w: region of %d bytes at %d does not fit a device of %d bytes with %d-byte blocks",
			ErrConfig, size, off, devSize, bs)
	}
	return size, nil
}

// run is the state shared by the workers of a run.
type run struct {
	cfg      Config
	unit     int
	size     int64
	nblocks  int64
	tracking bool           // per-block state: one I/O per block at a time, generations known
	state    []atomic.Int64 // per block: generation of its last write, busyBit while claimed
	pool     *Pool
	region   int // pool units per worker, a whole number of blocks
	log      *logWriter
	jobs     []*job

	mu         sync.Mutex // guards firstErr, mismatches
	firstErr   error
	mismatches []Mismatch
	errors     atomic.Int64
	nMismatch  atomic.Int64
	vUnits     atomic.Int64
	vWritten   atomic.Int64
	vZero      atomic.Int64
	vPrevious  atomic.Int64
}

const busyBit = 1 << 40

type job struct {
	id      int
	dev     Device
	first   int64 // sequential modes: first block of this job's slice
	n       int64 // blocks in the slice (sequential) or I/Os per pass (random)
	next    atomic.Int64
	writes  atomic.Int64 // completed writes, for FlushEvery
	flushes atomic.Uint32
	gen     atomic.Uint32 // generations when blocks are not tracked
}

// Run drives devs (one per job) as cfg says and returns the summary. It returns an error for a
// bad configuration, a failed request (the run stops at the first; the Result says what was
// done), ErrVerify when verification found mismatches, or a verify log write error.
func Run(ctx context.Context, cfg Config, devs []Device) (*Result, error) {
	if len(devs) == 0 || cfg.IODepth <= 0 {
		return nil, fmt.Errorf("%w: need at least one job and an iodepth of at least 1", ErrConfig)
	}
	if cfg.FlushEvery < 0 || cfg.Time < 0 {
		return nil, fmt.Errorf("%w: negative flush interval or time", ErrConfig)
	}
	size, err := checkGeometry(cfg.BlockSize, cfg.Offset, cfg.Size, cfg.DeviceSize)
	if err != nil {
		return nil, err
	}
	if cfg.MaxMismatches <= 0 {
		cfg.MaxMismatches = 10
	}
	if cfg.PoolSize <= 0 {
		cfg.PoolSize = DefaultPoolSize
	}
	r := &run{
		cfg: cfg, unit: Unit(cfg.BlockSize), size: size, nblocks: size / int64(cfg.BlockSize),
		tracking: cfg.Verify || cfg.VerifyLog != "",
	}
	workers := int64(len(devs) * cfg.IODepth)
	if r.tracking {
		if r.nblocks <= workers {
			return nil, fmt.Errorf("%w: --verify and --verify-log keep one I/O per block in flight: the region's %d blocks must outnumber jobs×iodepth = %d",
				ErrConfig, r.nblocks, workers)
		}
		r.state = make([]atomic.Int64, r.nblocks)
	}
	// Each worker sends its writes from its own region of the pool, rotating through it, so it
	// can stamp headers in place: the pool holds at least one block per worker.
	r.pool = NewPool(max(cfg.PoolSize, int(workers)*cfg.BlockSize), r.unit, cfg.Seed)
	r.region = r.pool.Units() / int(workers) / (cfg.BlockSize / r.unit) * (cfg.BlockSize / r.unit)
	for i, d := range devs {
		r.jobs = append(r.jobs, &job{id: i, dev: d})
	}

	res := &Result{
		Mode: cfg.Mode.String(), BlockSize: cfg.BlockSize, IODepth: cfg.IODepth, Jobs: len(devs),
		Offset: cfg.Offset, Size: size, Seed: cfg.Seed, VerifyLog: cfg.VerifyLog,
	}
	if cfg.VerifyLog != "" {
		// The baseline: what each unit holds before the run, so Check can accept it.
		baseline := make([]uint32, size/int64(r.unit))
		r.phase(ctx, phaseSpec{mode: Read, onePass: true, baseline: baseline})
		if err := r.err(); err != nil {
			return res, fmt.Errorf("reading the region for the verify log's baseline: %w", err)
		}
		r.log, err = createLog(cfg.VerifyLog, LogHeader{
			Seed: cfg.Seed, BlockSize: cfg.BlockSize, Unit: r.unit, Offset: cfg.Offset, Size: size,
			Jobs: len(devs), MultiConn: cfg.MultiConn, Target: cfg.Target,
			Started: time.Now().UTC().Format(time.RFC3339),
		}, baseline)
		if err != nil {
			return res, fmt.Errorf("verify log: %w", err)
		}
	}

	ru0 := rusage()
	st := r.phase(ctx, phaseSpec{mode: cfg.Mode, onePass: cfg.Time == 0, time: cfg.Time,
		verify: cfg.Verify, progress: cfg.Progress})
	ru1 := rusage()
	res.Elapsed = st.elapsed
	res.ReadIOs, res.WriteIOs, res.ReadBytes, res.WriteBytes = st.reads, st.writes, st.rbytes, st.wbytes
	res.Flushes = st.flushes
	secs := max(st.elapsed.Seconds(), 1e-9)
	res.MBps = float64(st.rbytes+st.wbytes) / secs / 1e6
	res.IOPS = float64(st.reads+st.writes) / secs
	all := st.rlat
	all.Merge(&st.wlat)
	res.Lat, res.ReadLat, res.WriteLat, res.FlushLat = all.Summary(), st.rlat.Summary(), st.wlat.Summary(), st.flat.Summary()
	res.CPUUser, res.CPUSys = ru1.user-ru0.user, ru1.sys-ru0.sys
	if moved := st.rbytes + st.wbytes; moved > 0 {
		res.CPUSecPerGB = (res.CPUUser + res.CPUSys).Seconds() / (float64(moved) / 1e9)
	}

	if cfg.Verify && cfg.Mode.writes() && r.err() == nil {
		t := time.Now()
		r.phase(ctx, phaseSpec{mode: Read, onePass: true, verify: true})
		res.Verify = &VerifyResult{ReadbackElapsed: time.Since(t)}
	}
	if cfg.Verify {
		if res.Verify == nil {
			res.Verify = &VerifyResult{}
		}
		v := res.Verify
		v.Units, v.Written, v.Zero, v.Previous = r.vUnits.Load(), r.vWritten.Load(), r.vZero.Load(), r.vPrevious.Load()
		v.Mismatches = r.nMismatch.Load()
		r.mu.Lock()
		v.First = append([]Mismatch(nil), r.mismatches...)
		r.mu.Unlock()
	}
	if r.log != nil {
		if err := r.log.close(); err != nil {
			r.fail(fmt.Errorf("verify log: %w", err))
		}
	}
	res.Errors = r.errors.Load()
	if err := r.err(); err != nil {
		res.FirstError = err.Error()
		return res, err
	}
	if res.Verify != nil && res.Verify.Mismatches > 0 {
		return res, fmt.Errorf("%w: %d of %d units (first: %v)", ErrVerify, res.Verify.Mismatches, res.Verify.Units, res.Verify.First[0])
	}
	return res, nil
}

// fail records err (the first one is kept) and counts it.
func (r *run) fail(err error) {
	r.errors.Add(1)
	r.mu.Lock()
	if r.firstErr == nil {
		r.firstErr = err
	}
	r.mu.Unlock()
}

func (r *run) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.firstErr
}

type phaseSpec struct {
	mode     Mode
	onePass  bool
	time     time.Duration
	verify   bool
	baseline []uint32 // if set, reads store each unit's CRC-32C here
	progress func(Progress)
}

type phaseStats struct {
	elapsed                                time.Duration
	reads, writes, rbytes, wbytes, flushes int64
	rlat, wlat, flat                       Histogram
}

// worker is one of IODepth goroutines of a job.
type worker struct {
	r    *run
	j    *job
	spec *phaseSpec
	stop *atomic.Bool
	rng  *rand.Rand
	buf  []byte // read destination
	// The worker's region of the pool: units [regionStart, regionStart+r.region); poolPos is
	// where its next write starts.
	regionStart, poolPos int
	st                   phaseStats
	ios                  atomic.Int64 // for progress
	bytes                atomic.Int64
	_                    [64]byte
}

// phase runs one pass or timed phase of all jobs' workers and returns the merged counts.
func (r *run) phase(ctx context.Context, spec phaseSpec) phaseStats {
	// Sequential modes give each job its slice of the region; random ones give each job an
	// equal share of the I/Os of one pass over the whole region.
	nj := int64(len(r.jobs))
	for i, j := range r.jobs {
		if spec.mode.random() {
			j.first, j.n = 0, r.nblocks/nj
		} else {
			j.first = r.nblocks * int64(i) / nj
			j.n = r.nblocks*int64(i+1)/nj - j.first
		}
		j.n = max(j.n, 1)
		j.next.Store(0)
	}
	var stop atomic.Bool
	var ws []*worker
	for _, j := range r.jobs {
		for k := range r.cfg.IODepth {
			w := &worker{r: r, j: j, spec: &spec, stop: &stop,
				rng: rand.New(rand.NewPCG(r.cfg.Seed, uint64(j.id)<<32|uint64(k))),
				buf: make([]byte, r.cfg.BlockSize),
			}
			w.regionStart = (j.id*r.cfg.IODepth + k) * r.region
			w.poolPos = w.regionStart
			ws = append(ws, w)
		}
	}
	phaseCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if spec.time > 0 {
		var c context.CancelFunc
		phaseCtx, c = context.WithTimeout(phaseCtx, spec.time)
		defer c()
	}
	watch := context.AfterFunc(phaseCtx, func() { stop.Store(true) })
	defer watch()

	start := time.Now()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			w.loop()
			if r.err() != nil {
				stop.Store(true)
			}
		})
	}
	done := make(chan struct{})
	if spec.progress != nil {
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					var p Progress
					for _, w := range ws {
						p.IOs += w.ios.Load()
						p.Bytes += w.bytes.Load()
					}
					p.Elapsed = time.Since(start)
					spec.progress(p)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	var st phaseStats
	st.elapsed = time.Since(start)
	for _, w := range ws {
		st.reads += w.st.reads
		st.writes += w.st.writes
		st.rbytes += w.st.rbytes
		st.wbytes += w.st.wbytes
		st.flushes += w.st.flushes
		st.rlat.Merge(&w.st.rlat)
		st.wlat.Merge(&w.st.wlat)
		st.flat.Merge(&w.st.flat)
	}
	return st
}

// loop issues I/Os one at a time until the phase stops.
func (w *worker) loop() {
	r, j, spec := w.r, w.j, w.spec
	for !w.stop.Load() && r.err() == nil {
		ticket := j.next.Add(1) - 1
		if spec.onePass && ticket >= j.n {
			return
		}
		var b int64
		if spec.mode.random() {
			b = w.rng.Int64N(r.nblocks)
		} else {
			b = j.first + ticket%j.n
		}
		c := w.claim(b)
		b, gen := c.block, c.gen
		write := spec.mode == Write || spec.mode == RandWrite || (spec.mode == RW && w.rng.Uint32()&1 == 0)
		if write {
			gen = w.write(b, gen)
		} else {
			w.read(b, gen)
		}
		if r.tracking {
			r.state[b].Store(int64(gen))
		}
	}
}

type claimed struct {
	block int64
	gen   uint32
}

// claim takes block b (random modes: the next free block from b) for this worker when blocks
// are tracked, and returns it with its current generation.
func (w *worker) claim(b int64) claimed {
	r := w.r
	if !r.tracking {
		return claimed{b, 0}
	}
	for {
		v := r.state[b].Load()
		if v&busyBit == 0 && r.state[b].CompareAndSwap(v, v|busyBit) {
			return claimed{b, uint32(v)}
		}
		if w.spec.mode.random() {
			if b++; b == r.nblocks {
				b = 0
			}
		} else {
			runtime.Gosched() // sequential wrap-around onto a block still in flight: wait
		}
	}
}

// write writes the next generation of block b (whose generation is cur) and returns the
// generation the block may now hold.
func (w *worker) write(b int64, cur uint32) uint32 {
	r, j := w.r, w.j
	gen := cur + 1
	if !r.tracking {
		gen = j.gen.Add(1)
	}
	off := r.cfg.Offset + b*int64(r.cfg.BlockSize)
	if r.log != nil {
		if err := r.log.intent(j.id, b, gen); err != nil {
			r.fail(fmt.Errorf("verify log: %w", err))
			return cur
		}
	}
	bs := r.cfg.BlockSize
	p := r.pool.Stamp(w.poolPos, bs, Header{Gen: gen, Offset: off, Seed: r.cfg.Seed, Writer: uint32(j.id)})
	if w.poolPos += bs / r.unit; w.poolPos == w.regionStart+r.region {
		w.poolPos = w.regionStart
	}
	t := time.Now()
	var err error
	if r.cfg.FUA {
		_, err = j.dev.WriteAtFUA(p, off)
	} else {
		_, err = j.dev.WriteAt(p, off)
	}
	w.st.wlat.Record(time.Since(t))
	if err != nil {
		r.fail(fmt.Errorf("write of %d bytes at %d: %w", bs, off, err))
		return gen
	}
	if r.log != nil {
		r.log.ack(j.id, b, gen, r.cfg.FUA)
	}
	w.st.writes++
	w.st.wbytes += int64(bs)
	w.ios.Add(1)
	w.bytes.Add(int64(bs))
	if n := int64(r.cfg.FlushEvery); n > 0 && j.writes.Add(1)%n == 0 {
		w.flush()
	}
	return gen
}

func (w *worker) flush() {
	r, j := w.r, w.j
	id := j.flushes.Add(1)
	if r.log != nil {
		r.log.flushStart(j.id, id)
	}
	t := time.Now()
	err := j.dev.Flush()
	w.st.flat.Record(time.Since(t))
	if err != nil {
		r.fail(fmt.Errorf("flush: %w", err))
		return
	}
	w.st.flushes++
	if r.log != nil {
		if err := r.log.flushDone(j.id, id); err != nil {
			r.fail(fmt.Errorf("verify log: %w", err))
		}
	}
}

func (w *worker) read(b int64, gen uint32) {
	r := w.r
	off := r.cfg.Offset + b*int64(r.cfg.BlockSize)
	t := time.Now()
	_, err := w.j.dev.ReadAt(w.buf, off)
	w.st.rlat.Record(time.Since(t))
	if err != nil {
		r.fail(fmt.Errorf("read of %d bytes at %d: %w", len(w.buf), off, err))
		return
	}
	w.st.reads++
	w.st.rbytes += int64(len(w.buf))
	w.ios.Add(1)
	w.bytes.Add(int64(len(w.buf)))
	if w.spec.baseline != nil {
		first := (off - r.cfg.Offset) / int64(r.unit)
		for k := 0; k < len(w.buf); k += r.unit {
			w.spec.baseline[first+int64(k/r.unit)] = crc32.Checksum(w.buf[k:k+r.unit], castagnoli)
		}
	}
	if w.spec.verify {
		for k := 0; k < len(w.buf); k += r.unit {
			r.verifyUnit(w.buf[k:k+r.unit], off+int64(k), gen)
		}
	}
}

// verifyUnit checks one unit read back: a block written in this run (gen > 0) must hold
// exactly that generation of this run; any other must be zeroes or a valid block of some run
// at the right offset.
func (r *run) verifyUnit(unit []byte, off int64, gen uint32) {
	r.vUnits.Add(1)
	h, err := DecodeHeader(unit)
	var expected string
	switch {
	case gen > 0:
		if err == nil && h.Offset == off && h.Seed == r.cfg.Seed && h.Gen == gen {
			r.vWritten.Add(1)
			return
		}
		expected = fmt.Sprintf("gen %d (seed %#x)", gen, r.cfg.Seed)
	case err == nil && h.Offset == off:
		r.vPrevious.Add(1)
		return
	case errors.Is(err, ErrNoHeader) && isZero(unit):
		r.vZero.Add(1)
		return
	default:
		expected = "zeroes or a block header for this offset"
	}
	r.nMismatch.Add(1)
	r.mu.Lock()
	if len(r.mismatches) < r.cfg.MaxMismatches {
		r.mismatches = append(r.mismatches, Mismatch{Offset: off, Expected: expected, Found: describe(unit, off)})
	}
	r.mu.Unlock()
}

type cpuTimes struct{ user, sys time.Duration }

func rusage() cpuTimes {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return cpuTimes{time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())}
}
