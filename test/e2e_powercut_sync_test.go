package test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// powerCutSync is the body of the TestPowerCut{Rebuild,ReAdd}* tests: rounds times, on an
// array whose members (spares too) are volatile (volatileSpecs: a SIGKILL is a power cut), a
// verifying raid5d bench writes while a member is failed and either a new spare is added
// (rebuild) or the member is re-added after missing some of the writes (re-add), and the
// power is cut at a random moment of that rebuild. The daemon restarts on the same members
// (the spare in the failed member's role), volatile again; bench --check checks every block
// while the rebuild goes on, and again once it has finished. At the end (with a bitmap) every
// role is failed in turn and the last round's log checked without it (then re-added); a scrub
// check finds 0 mismatches and every stripe's parity matches on the member files.
//
// With the journal every flushed block must be intact after every cut. With the bitmap a cut
// during a rebuild is a crash of a degraded array: the role being rebuilt is missing above the
// rebuild position, and its chunks in stripes being written at the cut can read wrong (the
// write hole, README "Crashes"). There the checks allow violations only in chunks of that
// role at or above the checkpoint its rebuild resumed from (of those bench lists, the first
// 10), only after the restart reported the write hole; every other block must be intact.
// RAID5D_CRASH_ROUNDS and RAID5D_CRASH_SEED make it a soak (as for crashLoop).
func powerCutSync(t *testing.T, reAdd, journal bool, rounds int, seed uint64) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	for name, set := range map[string]func(string) error{
		"RAID5D_CRASH_ROUNDS": func(v string) (err error) { rounds, err = strconv.Atoi(v); return err },
		"RAID5D_CRASH_SEED":   func(v string) (err error) { seed, err = strconv.ParseUint(v, 10, 64); return err },
	} {
		if v := os.Getenv(name); v != "" {
			if err := set(v); err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	a := newArray(t)
	if journal {
		a = newArrayWith(t, "--consistency", "journal", "--journal", filepath.Join(t.TempDir(), "journal.img"), "--journal-size", "8M")
	}
	cur := &array{dir: a.dir, members: append([]string(nil), a.members...)} // by role
	dir := t.TempDir()
	var log string
	var durable, holed int64
	hole := false // a restart reported the write hole
	// The role cut this round while being rebuilt, and the checkpoint its rebuild resumed
	// from: below it the new member must hold its chunks (the checkpoint synced it first).
	cutRole, resumed := -1, int64(0)
	check := func(s *server, what string, hole bool) {
		t.Helper()
		res, out := benchCheck(t, nil, s.uri, log, what)
		if res.Durable == 0 || res.Written == 0 {
			t.Fatalf("%s: %d blocks durable, %d written (want some durable):\n%s", what, res.Durable, res.Written, out)
		}
		if res.Violations == 0 {
			durable += res.Durable
			return
		}
		if journal || !hole {
			t.Fatalf("%s: %d violations (want 0; write hole reported: %v):\n%s", what, res.Violations, hole, out)
		}
		for _, v := range res.First {
			if r, at := roleAt(v.Offset), v.Offset/stripeData*chunkSize; r != cutRole || at < resumed {
				t.Fatalf("%s: a violation at %d, in role %d's chunk at %d: not in the write hole of role %d (above its checkpoint at %d):\n%s",
					what, v.Offset, r, at, cutRole, resumed, out)
			}
		}
		durable += res.Durable
		holed += res.Violations
	}
	for i := range rounds {
		role := i % memberCount
		specs := volatileSpecs(cur, i)
		s := (&array{dir: a.dir, members: specs}).serve(t)
		// Slow enough to be cut in the middle under the load: a full rebuild takes 16 s, a
		// re-add's resync of the bench's 4 regions 4 s.
		speed := map[bool]string{false: "4M", true: "2M"}[reAdd]
		s.mustManage("rebuild", "--speed-min", speed, "--speed-max", speed)
		log = filepath.Join(dir, fmt.Sprintf("round%02d.vlog", i))
		bs := []string{"4K", "36K", fmt.Sprintf("%dK", stripeData>>10)}[i%3]
		bench := startCrashBench(t, nil, s.uri, log, bs, 2000+i)
		s.mustManage("fail", specs[role])
		what := "the rebuild onto a spare"
		var st *r5Status
		if reAdd {
			what = "the re-add's resync"
			// A re-add records each piece before it serves it, and the bench's writes pull
			// the pieces they reach ahead of the throttle: under load the whole resync
			// (crashBenchSize's stripes, 8 MiB of each member) can end in a fraction of a
			// second, before a cut after a fixed delay (CI, once). Cut at a random point of
			// its bytes; a re-add that ended before it is failed again and re-added.
			for attempt := 1; ; attempt++ {
				// Let the member miss some writes (and their flushes) before it comes back.
				time.Sleep(time.Duration(200+rng.IntN(300)) * time.Millisecond)
				s.mustManage("re-add", specs[role])
				want := int64(crashBenchSize) / stripeData * chunkSize * int64(1+rng.IntN(5)) / 8
				st = s.waitStatus(what+" to pass its cut point", 30*time.Second, func(st *r5Status) bool {
					return st.healthy() || st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Resynced >= want
				})
				if !st.healthy() {
					break
				}
				if attempt == 5 {
					t.Fatalf("round %d: %s ended before it resynced %d bytes, where it was to be cut, %d times", i, what, want, attempt)
				}
				t.Logf("round %d: %s ended before it resynced %d bytes, where it was to be cut: again", i, what, want)
				s.mustManage("fail", specs[role])
			}
		} else {
			spare := a.newSpare(t, fmt.Sprintf("spare%02d.img", i))
			cur.members[role] = spare
			s.mustManage("add", volatileSpecs(&array{members: []string{spare}}, i)[0])
			st = s.waitStatus(what+" under way", 30*time.Second, func(st *r5Status) bool {
				return st.Sync != nil && st.Sync.Kind == "rebuild" && (st.Sync.Done > 0 || st.Sync.Resynced > 0)
			})
			// The rebuild checkpoints its position every second: cut after one or two of them.
			time.Sleep(time.Duration(1000+rng.IntN(1500)) * time.Millisecond)
		}
		s.crash()
		benchKilled(t, bench, i)

		// The check reads while the rebuild goes on (slowly), then it speeds up.
		s = (&array{dir: a.dir, members: volatileSpecs(cur, i)}).serve(t, "--sync-speed-max", "4M")
		after := s.status()
		switch r := after.LastRebuild; {
		case after.Sync != nil && after.Sync.Kind == "rebuild" && after.Sync.Role == role:
			resumed = after.Sync.Resumed
		case reAdd && r != nil && r.ReAdd && r.Role == role && r.Err == "":
			// A re-add resumes with only the pieces it had not resynced: it may have
			// finished already (and the resync of the stripes the cut tore begun).
			resumed = r.Resumed
		case reAdd && r == nil && after.healthy():
			// The re-add ended just as it was cut: its last superblock write (the member
			// active) reached a member before the kill, and the newest superblock wins.
			// The array is whole: nothing in any role may be wrong.
			resumed = math.MaxInt64
			t.Logf("round %d: %s had ended at the cut", i, what)
		default:
			t.Fatalf("round %d: after the restart: sync %+v, last rebuild %+v, want role %d's rebuild resumed", i, after.Sync, r, role)
		}
		hole = hole || after.WriteHole
		cutRole = role
		check(s, fmt.Sprintf("round %d (bs %s): check after the power cut in %s", i, bs, what), hole)
		s.mustManage("rebuild", "--speed-min", "400M", "--speed-max", "1G")
		s.waitStatus(what+" to finish after the restart", 60*time.Second, func(st *r5Status) bool {
			return st.healthy() && st.Sync == nil
		})
		check(s, fmt.Sprintf("round %d (bs %s): check after %s finished", i, bs, what), hole)
		t.Logf("round %d (bs %s): cut in %s at %d of %d bytes (at least); resumed from %d; write hole reported: %v",
			i, bs, what, st.Sync.Done, st.Sync.Total, resumed, after.WriteHole)
		s.stop()
	}

	// Every role left out in turn: its data is rebuilt from the others' on every read (a
	// journaled array has no bitmap to re-add a member with; there the scrub and the member
	// files' parity show the same).
	s := cur.serve(t, "--sync-speed-min", crashSyncSpeed)
	for role, m := range cur.members {
		if journal {
			break
		}
		s.mustManage("fail", m)
		check(s, fmt.Sprintf("check with role %d left out", role), hole)
		s.mustManage("re-add", m)
		s.waitStatus("the member re-added", 60*time.Second, func(st *r5Status) bool {
			return st.healthy() && st.Sync == nil
		})
	}
	s.scrubClean()
	s.stop()
	checkParity(t, cur)
	t.Logf("seed %d: %d power cuts in %s (journal %v), %d durable blocks checked intact after them, %d violations in the write hole, scrub check: 0 mismatches",
		seed, rounds, map[bool]string{false: "rebuilds onto a spare", true: "re-adds' resyncs"}[reAdd], journal, durable, holed)
}

// roleAt is the role whose member holds the array's byte at off (left-symmetric: stripe s has
// its parity on role n-1-s%n, and data chunk i on role (parity+1+i)%n).
func roleAt(off int64) int {
	s, i := off/stripeData, off%stripeData/chunkSize
	p := memberCount - 1 - s%memberCount
	return int((p + 1 + i) % memberCount)
}

// TestPowerCutRebuildJournal: power cuts (SIGKILL with volatile members) in the middle of a
// rebuild onto a spare under a verifying load, on a journaled array: nothing flushed is lost.
// See powerCutSync.
func TestPowerCutRebuildJournal(t *testing.T) {
	powerCutSync(t, false, true, 3, 20261205)
}

// TestPowerCutRebuild: the same with the bitmap: only the write hole, in the rebuilt role.
func TestPowerCutRebuild(t *testing.T) {
	powerCutSync(t, false, false, 2, 20261207)
}

// TestPowerCutReAdd: power cuts in the middle of a re-add's resync under a verifying load
// (with the bitmap: a journaled array has no re-add): only the write hole, in the re-added
// role. See powerCutSync.
func TestPowerCutReAdd(t *testing.T) {
	powerCutSync(t, true, false, 2, 20261206)
}
