package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// crash SIGKILLs the server: no drain, no flush, no clean mark — a daemon crash.
func (s *server) crash() {
	s.t.Helper()
	s.stopped = true
	if !s.running() {
		s.t.Fatalf("server died before the crash: %v", s.err)
	}
	s.proc.stop(syscall.SIGKILL, stopGrace)
}

// crashBenchSize is the region of the array the crash loops' bench writes (from offset 0): an
// eighth of the array, a few of the bitmap's default regions (6 MiB), so that a resync limited
// to them is plainly smaller than a full one.
const crashBenchSize = 24 << 20

// crashSyncSpeed is the crash loops' --sync-speed-min: the resync and the scrub run at full
// speed although bench --check reads meanwhile, so the loops do not wait for them.
const crashSyncSpeed = "200M"

// crashStatus is the part of `raid5d status --json` the crash loops read: the resync after
// an unclean shutdown, the write-intent bitmap and the last scrub (and the bytes written to the
// members, which the lab tests read).
type crashStatus struct {
	Unclean    bool           `json:"unclean"`
	Sync       *crashProgress `json:"sync"`
	LastResync *crashProgress `json:"last_resync"`
	LastScrub  *crashProgress `json:"last_scrub"`
	Bitmap     *struct {
		RegionBytes int64 `json:"region_bytes"`
		Regions     int   `json:"regions"`
		Set         int   `json:"set"`
	} `json:"bitmap"`
	Consistency string `json:"consistency"`
	Journal     *struct {
		Replayed int  `json:"replayed"`
		Missing  bool `json:"missing"`
	} `json:"journal"`
	Counters struct {
		MemberBytesWritten int64 `json:"member_bytes_written"`
		MappedBytesWritten int64 `json:"mapped_bytes_written"`
		PlacedBytes        int64 `json:"placed_bytes"`
	} `json:"counters"`
}

// waitReplayed checks a journaled array after a restart: the journal was replayed, no resync
// runs or ran (the replay made every logged stripe whole), nothing is reported unclean. It
// returns the records replayed.
func (s *server) waitReplayed(round int) int {
	s.t.Helper()
	st := s.crashStatus()
	// A rebuild may be running: one killed mid-way resumes from its checkpoint (crashLoop.churn).
	if st.Consistency != "journal" || st.Journal == nil || st.Journal.Missing || st.Unclean ||
		(st.Sync != nil && st.Sync.Kind != "rebuild") || st.LastResync != nil || st.Bitmap != nil {
		s.t.Fatalf("round %d: after the restart of a journaled array: %+v, sync %+v (want the journal, no resync, no bitmap)", round, st, st.Sync)
	}
	return st.Journal.Replayed
}

type crashProgress struct {
	Kind       string `json:"kind"`
	Done       int64  `json:"done"`
	Total      int64  `json:"total"`
	Mismatches int64  `json:"mismatches"`
	Err        string `json:"error"`
}

// crashStatus is `raid5d status --json` from the running daemon, the fields crashStatus has.
func (s *server) crashStatus() *crashStatus {
	s.t.Helper()
	out, errOut, code := s.manageSplit("status", "--json")
	var st crashStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("raid5d status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	return &st
}

// waitResync waits until the resync that follows an unclean restart has ended, and checks
// that it finished and covered only the bitmap's regions that the bench can have dirtied
// (those overlapping [0, crashBenchSize)), and at least one of them. It returns the resync's
// bytes per member.
func (s *server) waitResync(round int) int64 {
	s.t.Helper()
	var st *crashStatus
	waitFor(s.t, "the resync after the restart", 60*time.Second, s.proc, func() bool {
		st = s.crashStatus()
		return st.LastResync != nil && (st.Sync == nil || st.Sync.Kind != "resync")
	})
	r := st.LastResync
	if st.Bitmap == nil || st.Bitmap.RegionBytes <= 0 {
		s.t.Fatalf("round %d: status shows no write-intent bitmap: %+v", round, st)
	}
	perRegion := st.Bitmap.RegionBytes / (memberCount - 1) // member bytes per bit
	touched := (crashBenchSize + st.Bitmap.RegionBytes - 1) / st.Bitmap.RegionBytes
	if r.Kind != "resync" || r.Err != "" || r.Done != r.Total || r.Total <= 0 || r.Total > touched*perRegion {
		s.t.Fatalf("round %d: resync %+v: want finished, over 1 to %d regions of %d bytes per member (those the bench wrote; a full resync is %d bytes)",
			round, *r, touched, perRegion, memberSize-dataOffset)
	}
	return r.Total
}

// scrubClean runs scrub check to its end and fails the test unless it found 0 mismatches.
func (s *server) scrubClean() {
	s.t.Helper()
	out, code := s.manage("scrub", "check", "--wait", "--poll", "50ms")
	st := s.crashStatus()
	if code != 0 || !strings.Contains(out, " 0 mismatches") || st.LastScrub == nil ||
		st.LastScrub.Kind != "check" || st.LastScrub.Mismatches != 0 || st.LastScrub.Done != st.LastScrub.Total {
		s.t.Fatalf("scrub check after the crashes: exit %d, last scrub %+v (want 0 mismatches over the whole array)\n%s", code, st.LastScrub, out)
	}
}

// crashLoop is the body of the crash tests: rounds times, raid5d bench writes with periodic
// flushes and logs what it wrote, the daemon dies at a random moment (SIGKILL), and after the
// restart bench --check proves that every block flushed (or acknowledged after a flush) before
// the kill is intact and every other block holds one of the values written to it or its old
// contents; then the resync must cover only the regions the bench wrote. The same array
// lives through every crash, so later rounds also start from a dirty array. After each kill,
// before the restart, the members are checked offline (checkParityOffline): every stripe
// outside the regions being written must have right parity, which the restart's resync
// would otherwise hide; every settleEvery rounds the round first writes elsewhere and lets
// those writes settle, so that there are acknowledged writes there to check. At the end a
// scrub check finds no stripe whose parity does not match.
type crashLoop struct {
	rounds int
	seed   uint64
	// load and check give the member specs the daemon is started with for a round's load (and
	// kill), and for the check after it; nil means the plain member paths.
	load, check func(a *array, round int) []string
	// journal: the array is created with --consistency journal (the journal a plain file
	// beside the members); after each restart the replay, not a resync, must make it whole.
	journal bool
	// remote: the members are exports on hosts of their own in a lab (newNetArray), the
	// daemon runs on the lab's raid5d host and bench on its client host.
	remote bool
	// bs: the block size of every round's bench, instead of the three taken in turn.
	bs string
	// mapped: the kill waits until the daemon has written some bytes through the members'
	// mappings (with bs below a stripe: placed read-modify-writes).
	mapped bool
	// edges: the kill waits until the daemon has placed a part of a stripe (a placed write's
	// edge: its placed bytes are no longer whole stripes).
	edges bool
	// churn, if set, runs once the round's load is writing, before the kill's random delay:
	// it fails a member, rebuilds it, ... (crashChurn). After the restart the loop waits for
	// the array to be whole again (settled) before the next round.
	churn func(s *server, a *array, round int, rng *rand.Rand)
}

// The soak (test/bench/crash-soak.sh) runs the crash loops longer through the environment:
// RAID5D_CRASH_ROUNDS sets the rounds of each loop, RAID5D_CRASH_TIME (a Go duration) stops
// a loop starting rounds after that long, RAID5D_CRASH_SEED changes the seed of the kill
// moments.
func (c crashLoop) run(t *testing.T) {
	var budget time.Duration
	for _, e := range []struct {
		name string
		set  func(string) error
	}{
		{"RAID5D_CRASH_ROUNDS", func(v string) (err error) { c.rounds, err = strconv.Atoi(v); return err }},
		{"RAID5D_CRASH_SEED", func(v string) (err error) { c.seed, err = strconv.ParseUint(v, 10, 64); return err }},
		{"RAID5D_CRASH_TIME", func(v string) (err error) { budget, err = time.ParseDuration(v); return err }},
	} {
		if v := os.Getenv(e.name); v != "" {
			if err := e.set(v); err != nil {
				t.Fatalf("%s=%q: %v", e.name, v, err)
			}
		}
	}
	start := time.Now()
	rng := rand.New(rand.NewPCG(c.seed, 1))
	var a *array
	var na *netArray
	var client []string // the prefix bench runs under (see prefixed)
	switch {
	case c.remote:
		na = newNetArray(t, nil)
		a, client = &array{dir: t.TempDir(), members: na.uris}, na.client.prefix()
	case c.journal:
		a = newArrayWith(t, "--consistency", "journal", "--journal", filepath.Join(t.TempDir(), "journal.img"), "--journal-size", "8M")
	default:
		a = newArray(t)
	}
	dir := t.TempDir()
	serveWith := func(specs func(*array, int) []string, round int) *server {
		b := a
		if specs != nil {
			b = &array{dir: a.dir, members: specs(a, round)}
		}
		if na != nil {
			return na.lab.serve(t, na.client, b.members, "--sync-speed-min", crashSyncSpeed)
		}
		return b.serve(t, "--sync-speed-min", crashSyncSpeed)
	}
	s := serveWith(c.load, 0)
	var durable, resynced, checkedStripes, settled int64
	rounds, replayed := 0, 0
	for i := range c.rounds {
		if budget > 0 && time.Since(start) > budget {
			break
		}
		rounds++
		log := filepath.Join(dir, fmt.Sprintf("round%02d.vlog", i))
		// A third of the rounds mix block sizes across stripe boundaries, a third write whole
		// stripes (the daemon reads those straight into the members' mappings when they have
		// arrived: placed writes); all flush every 16 writes per job, two jobs on two
		// connections.
		bs := []string{"4K", "36K", fmt.Sprintf("%dK", stripeData>>10)}[i%3]
		if c.bs != "" {
			bs = c.bs
		}
		if i%settleEvery == 0 {
			settled += settleWrites(t, s, client, bs, 2000+i)
		}
		// Kill once the load is running, at a random moment after that.
		bench := startCrashBench(t, client, s.uri, log, bs, 1000+i)
		if c.mapped {
			waitFor(t, "writes through the members' mappings", 20*time.Second, bench, func() bool {
				return s.crashStatus().Counters.MappedBytesWritten > 0
			})
		}
		if c.edges {
			waitFor(t, "a placed write's edge", 20*time.Second, bench, func() bool {
				return s.crashStatus().Counters.PlacedBytes%stripeData != 0
			})
		}
		if c.churn != nil {
			c.churn(s, a, i, rng)
		}
		time.Sleep(time.Duration(rng.IntN(600)) * time.Millisecond)
		s.crash()
		benchKilled(t, bench, i)
		if na != nil {
			for _, m := range na.members {
				m.afterClientKilled(t)
			}
		}
		// Before the restart's resync or replay rewrites the parity of the stripes being
		// written: every other stripe must already be consistent.
		var host []string
		if na != nil {
			host = na.lab.hub.prefix()
		}
		checked, dirty := checkParityOffline(t, host, specsOf(c.check, a, i), fmt.Sprintf("round %d (bs %s): after the crash", i, bs))
		checkedStripes += checked - dirty

		s = serveWith(c.check, i)
		// The check reads while the resync runs: reads of regions not resynced yet are correct
		// too (data chunks are authoritative).
		durable += checkCrashBench(t, client, s.uri, log, fmt.Sprintf("round %d (bs %s): check after the crash", i, bs))
		os.Remove(log) // a soak's logs would fill the disk; a failed round's log stays
		if c.journal {
			replayed += s.waitReplayed(i)
		} else {
			resynced += s.waitResync(i)
		}
		if c.churn != nil {
			// Killed degraded: the member was left out as stale, and is added back. Killed
			// during a rebuild onto it: the rebuild resumed from its checkpoint, and it stays.
			if st := s.status(); len(st.Missing) > 0 && (st.Sync == nil || st.Sync.Kind != "rebuild") {
				addBack(s, "add", a.members[i%len(a.members)])
			}
			s.mustManage("rebuild", "--speed-min", "400M", "--speed-max", "1G")
			s.waitStatus("the array whole again after the restart", 60*time.Second, (*r5Status).healthy)
		}
		if i+1 < c.rounds && !sameSpecs(c.check, c.load, a, i) {
			s.stop() // a clean shutdown, then the next round's load on the load's specs
			s = serveWith(c.load, i+1)
		}
	}
	s.scrubClean()
	s.stop()
	if c.journal {
		if replayed == 0 {
			t.Fatalf("seed %d: %d crashes of a journaled array and no record ever replayed", c.seed, rounds)
		}
		t.Logf("seed %d: %d crashes, %d durable blocks checked intact, %d journal records replayed, no resync, %d stripes' parity checked offline outside the stripes being written at the crashes (%d rounds wrote and settled first), scrub check: 0 mismatches",
			c.seed, rounds, durable, replayed, checkedStripes, settled)
		return
	}
	t.Logf("seed %d: %d crashes, %d durable blocks checked intact, resyncs of %.1f MiB per member in all (a full one is %d MiB), %d stripes' parity checked offline outside the stripes being written at the crashes (%d rounds wrote and settled first), scrub check: 0 mismatches",
		c.seed, rounds, durable, float64(resynced)/(1<<20), (memberSize-dataOffset)>>20, checkedStripes, settled)
}

// startCrashBench starts the crash loops' load on uri: raid5d bench writing randomly over
// [0, crashBenchSize) in blocks of bs, two jobs of 8 in flight, a FLUSH every 16 writes per
// job, logging every write to log for --check. It returns once the load is running (its log
// has grown past the baseline by a few thousand records).
func startCrashBench(t *testing.T, client []string, uri, log, bs string, seed int) *proc {
	t.Helper()
	bench := startProcIn(t, client, raid5dBin, "bench", uri, "--rw", "randwrite", "--bs", bs,
		"--iodepth", "8", "--jobs", "2", "--size", fmt.Sprint(crashBenchSize), "--time", "30s",
		"--flush-every", "16", "--seed", fmt.Sprint(seed), "--verify-log", log)
	var base int64 = -1
	waitFor(t, "bench to start writing", 20*time.Second, bench, func() bool {
		fi, err := os.Stat(log)
		if err != nil {
			return false
		}
		if base < 0 || fi.Size() < base+(16<<10) {
			if base < 0 && fi.Size() > 0 {
				base = fi.Size() // header and baseline CRCs are written before any write
			}
			return false
		}
		return true
	})
	return bench
}

// benchKilled waits for the bench whose server was just killed under it to fail.
func benchKilled(t *testing.T, bench *proc, round int) {
	t.Helper()
	// bench must notice on its own: a SIGTERM would end its run politely (exit 0) if it
	// came before bench saw the connection close, as it did once under a loaded soak.
	select {
	case <-bench.exited:
	case <-time.After(20 * time.Second):
		bench.stop(syscall.SIGKILL, stopGrace)
		t.Fatalf("round %d: bench still running 20 s after the server was killed under it", round)
	}
	if bench.err == nil {
		t.Fatalf("round %d: bench exited 0 although the server was killed under it:\n%s", round, bench.out.String())
	}
}

// checkCrashBench runs bench --check of log against uri: every block flushed (or acknowledged
// after a flush) must read as written, every other block as one of its writes or its old
// contents. It fails the test (what says where) unless there are 0 violations and some
// durable blocks, and returns the durable blocks checked.
func checkCrashBench(t *testing.T, client []string, uri, log, what string) int64 {
	t.Helper()
	res, out := benchCheck(t, client, uri, log, what)
	if res.Violations != 0 || res.Durable == 0 || res.Written == 0 {
		t.Fatalf("%s: %d violations, %d blocks durable, %d written (want 0 violations and some durable):\n%s",
			what, res.Violations, res.Durable, res.Written, out)
	}
	return res.Durable
}

// benchResult is raid5d bench --check --json's result: First lists the first violations (at
// most 10), by offset.
type benchResult struct {
	Blocks, Written, Durable, Violations int64
	First                                []struct{ Offset int64 }
}

// benchCheck runs bench --check of log against uri and returns its result (violations or not)
// and its output; it fails the test only if bench gave no result.
func benchCheck(t *testing.T, client []string, uri, log, what string) (*benchResult, string) {
	t.Helper()
	name, args := prefixed(client, raid5dBin, "bench", uri, "--check", log, "--json")
	out, err := runToolErr(name, args...)
	var res benchResult
	// bench exits 1 on violations, after its JSON (and a line on stderr, which out holds too).
	if jerr := json.NewDecoder(strings.NewReader(out)).Decode(&res); jerr != nil || err != nil && res.Violations == 0 {
		t.Fatalf("%s: %v %v\n%s", what, err, jerr, out)
	}
	return &res, out
}

// specsOf returns the member specs f gives for round (crashLoop.load, check): the plain member
// paths when f is nil.
func specsOf(f func(*array, int) []string, a *array, round int) []string {
	if f == nil {
		return a.members
	}
	return f(a, round)
}

// sameSpecs reports whether the check after round i runs on the specs the next load uses.
func sameSpecs(check, load func(*array, int) []string, a *array, i int) bool {
	return fmt.Sprint(specsOf(check, a, i)) == fmt.Sprint(specsOf(load, a, i+1))
}

// settleEvery: every this many rounds a crash loop writes and lets the writes settle first
// (settleWrites), so that the check after the kill has acknowledged writes of the daemon to
// look at outside the regions being written: a round's own load is all in regions whose
// write-intent bits are still set at the kill (a bit is cleared only after its region has
// been idle for raid.BitmapClearDelay), which the check counts apart.
const settleEvery = 4

// settleWrites runs raid5d bench for a moment over [crashBenchSize, 2*crashBenchSize) in
// blocks of bs (the loads write below crashBenchSize, in other bitmap regions), to its end,
// and waits until the write-intent bitmap has no bit set: those writes' stripes are then
// outside the regions the kill can find being written, so the offline check after it
// compares their parity (a wrong one the restart's resync would not touch). With no bitmap
// (the journal), or a member missing (no bit is cleared while degraded), it only writes.
// It returns 1 if the writes settled, 0 if not.
func settleWrites(t *testing.T, s *server, client []string, bs string, seed int) int64 {
	t.Helper()
	name, args := prefixed(client, raid5dBin, "bench", s.uri, "--rw", "randwrite", "--bs", bs,
		"--iodepth", "8", "--jobs", "2", "--offset", fmt.Sprint(crashBenchSize), "--size", fmt.Sprint(crashBenchSize),
		"--time", "1s", "--flush-every", "16", "--seed", fmt.Sprint(seed))
	if out, err := runToolErr(name, args...); err != nil {
		t.Fatalf("the settled writes: %v\n%s", err, out)
	}
	if st := s.crashStatus(); st.Bitmap == nil || len(s.status().Missing) > 0 {
		return 0
	}
	waitFor(t, "the settled writes' write-intent bits cleared", 30*time.Second, s.proc, func() bool {
		return s.crashStatus().Bitmap.Set == 0
	})
	return 1
}

// checkParityOffline runs `raid5d scrub check MEMBER...` on the members of a killed daemon
// (on host, a lab's: nil for this one): every stripe outside the regions the crash may have
// left being written (the write-intent bitmap's set bits, the journal's records) must have
// parity equal to the XOR of its data, before the restart's resync or replay rewrites any.
// A mismatch there is an acknowledged write with wrong parity, which the resync would hide:
// the test fails (what says where) naming the stripes. It returns the stripes checked, and
// of them those in the regions being written.
func checkParityOffline(t *testing.T, host, members []string, what string) (checked, dirty int64) {
	t.Helper()
	args := append([]string{"scrub", "check", "--control", filepath.Join(t.TempDir(), "none.sock")}, members...)
	name, args := prefixed(host, raid5dBin, args...)
	out, err := runToolErr(name, args...)
	var stripes int64
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "scrub check offline: "); ok {
			fmt.Sscanf(rest, "%d of %d stripes checked; %d in regions", &checked, &stripes, &dirty)
		}
	}
	if err != nil || stripes == 0 {
		t.Fatalf("%s: raid5d scrub check of the members offline: %v (exit 5: parity wrong outside the regions being written)\n%s", what, err, out)
	}
	return checked, dirty
}

// TestCrashLoop kills the daemon with SIGKILL at 20 random moments under a verifying bench
// (see crashLoop). The member files keep every write the daemon made (the kernel has them):
// what a crash loses is what the daemon itself held, such as dirty stripes in its cache.
func TestCrashLoop(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{rounds: 20, seed: 20261130}.run(t)
}

// crashChurn is a crash loop's churn: under the round's load it fails member round%4 and,
// after a random moment of degraded writes, removes it and adds it back as a spare, whose
// rebuild (slowed to a few MiB/s) runs under the load; the kill comes during the degraded
// writes (a third of the rounds) or during the rebuild.
func crashChurn(s *server, a *array, round int, rng *rand.Rand) {
	m := a.members[round%len(a.members)]
	s.mustManage("fail", m)
	time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
	if round%3 == 1 {
		return // killed degraded
	}
	s.mustManage("rebuild", "--speed-min", "4M", "--speed-max", "4M")
	s.mustManage("remove", m)
	addBack(s, "add", m)
}

// addBack runs `raid5d add` or `re-add` of m until it is no longer refused for the writes the
// member was failed with still under way (raid.ErrMemberBusy), bounded.
func addBack(s *server, cmd, m string) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, code := s.manage(cmd, m)
		if code == 0 {
			return
		}
		if !strings.Contains(out, "under way from before it failed") || time.Now().After(deadline) {
			s.t.Fatalf("raid5d %s %s: exit %d\n%s", cmd, m, code, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// crashReAdd is crashChurn with the member brought back by re-add (the bitmap's resync of the
// regions written while it was away), and never killed before the re-add: the kill comes
// during the re-add's resync (slowed to 4 MiB/s) or, when it has already ended, just after.
func crashReAdd(s *server, a *array, round int, rng *rand.Rand) {
	m := a.members[round%len(a.members)]
	s.mustManage("fail", m)
	time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
	s.mustManage("rebuild", "--speed-min", "4M", "--speed-max", "4M")
	addBack(s, "re-add", m)
}

// TestCrashLoopReAdd is TestCrashLoop (write-intent bitmap) with a member failed under the
// load and re-added (crashReAdd): every kill comes during the re-add's resync, under writes.
// After each restart the re-add resumes from its record; every flushed block is intact,
// the resync covers only the regions written, and at the end scrub check finds 0 mismatches.
func TestCrashLoopReAdd(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{rounds: 4, seed: 20261205, churn: crashReAdd}.run(t)
}

// TestCrashLoopChurnJournal is TestCrashLoop on an array with the journal policy whose
// members fail and are rebuilt under the load (crashChurn): every kill comes while the array
// is degraded, during degraded writes or while the failed member is being rebuilt, where the
// write-intent bitmap leaves the write hole and the journal must not: after each restart every
// block flushed before the kill is intact, and at the end scrub check finds 0 mismatches.
func TestCrashLoopChurnJournal(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{rounds: 6, seed: 20261206, journal: true, churn: crashChurn}.run(t)
}

// TestCrashLoopRMW is TestCrashLoop under random 4 KiB writes only, each round killed once the
// daemon is doing them as placed read-modify-writes (the data pwritten, the parity folded into
// its member's mapping; raid/rmw.go): every write acknowledged after a flush survives, every
// other block holds one of its writes or its old contents, the resync covers only the
// regions written, and the scrub after the last round finds every stripe's parity right.
func TestCrashLoopRMW(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{rounds: 8, seed: 20261202, bs: "4K", mapped: true}.run(t)
}

// TestCrashLoopPlacedEdges is TestCrashLoop under random writes of a stripe and a half, each
// round killed once the daemon has placed a part of a stripe: every other write
// starts or ends inside a stripe, whose part the daemon reads straight into the mappings too
// when the cache holds no newer data of it (a placed write's edges, raid/placed.go), its
// parity computed from all of the stripe's data there. Every write acknowledged after a
// flush survives, every other block holds one of its writes or its old contents, and the
// scrub after the last round finds every stripe's parity right.
func TestCrashLoopPlacedEdges(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{rounds: 6, seed: 20261208, bs: fmt.Sprintf("%dK", stripeData*3/2>>10), edges: true}.run(t)
}
