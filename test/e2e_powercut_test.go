package test

import "testing"

// volatileSpecs returns the array's members as faulty:PATH?volatile specs: each member keeps
// the daemon's writes in the daemon's memory until it syncs the member, then writes them out
// in a random order (raid/member/faulty's volatile write cache), so a SIGKILL loses what a power cut would.
func volatileSpecs(a *array, _ int) []string {
	specs := make([]string, len(a.members))
	for i, m := range a.members {
		specs[i] = "faulty:" + m + "?volatile"
	}
	return specs
}

// TestPowerCutLoop is TestCrashLoop with every member volatile: each kill is a power cut that
// loses every write not yet synced to a member, and of a sync in progress a random subset of
// its pages. After each cut the daemon restarts on the same files, as volatile members again
// (even rounds) or as plain files (odd rounds, then stopped cleanly for the next load), and
// bench --check proves that every block flushed before the cut is intact and every other
// block holds its old contents or one of the values written to it; the resync covers only
// the regions the bench wrote; at the end a scrub check finds 0 mismatches.
func TestPowerCutLoop(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{
		rounds: 10,
		seed:   20261201,
		load:   volatileSpecs,
		check: func(a *array, round int) []string {
			if round%2 == 0 {
				return volatileSpecs(a, round)
			}
			return a.members
		},
	}.run(t)
}

// TestPowerCutJournal is TestPowerCutLoop on an array with the journal policy: every kill is a
// power cut of the volatile members (the journal is a plain file, synced as it is written), and
// after each restart the journal's replay — not a resync — must leave every flushed block
// intact and every stripe's parity right (scrub check at the end: 0 mismatches).
func TestPowerCutJournal(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	crashLoop{rounds: 8, seed: 20261202, load: volatileSpecs, check: volatileSpecs, journal: true}.run(t)
}
