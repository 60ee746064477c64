package raid

import (
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/stripe"
)

// writeGate is the one door every write of member data goes through: a client write's member
// writes, the stripe cache's write-outs, trims of a member's data area, a rebuild's writes to
// its spare, a scrub's parity repairs, and the write-intent bitmap's pages. The superblocks do
// not pass it (recording a failure must still be possible after the array has failed), nor
// does the journal, which lives on a device of its own.
//
// The array's failed state is decided in one place, recount, which shuts the gate the moment
// two roles have no working member. Shutting is final. A writer enters before each member
// write and leaves as soon as the system call returns, before it handles the result (a failing
// writer calls fail, which waits at the gate, outside it). After shut, enter refuses; drain
// then waits for the writers still inside to leave, so when fail returns no member that still
// works is written again and the survivors keep exactly what they held at the failure (what a
// forced assembly works from). A writer inside for a member that has itself failed is not
// waited for: that member is never read again, and a hung one must not hold the failure up
// (its write deadline fails it; see watchdog).
type writeGate struct {
	shut   atomic.Bool
	inside [stripe.MaxMembers]atomic.Int32 // by role: writers between enter and leave
}

// enter admits a write of role's member, or reports false once the gate is shut. Every true
// must be followed by leave(role).
func (g *writeGate) enter(role int) bool {
	g.inside[role].Add(1)
	if g.shut.Load() {
		// Shut between the two loads: drain may have seen this writer; leaving is enough.
		g.inside[role].Add(-1)
		return false
	}
	return true
}

// leave ends a write that enter admitted.
func (g *writeGate) leave(role int) { g.inside[role].Add(-1) }

// close shuts the gate; writers that enter from now on are refused. It does not wait (drain
// does), so it may be called with sbMu held.
func (g *writeGate) close() { g.shut.Store(true) }

// closed reports whether the gate is shut: whether the array has failed.
func (g *writeGate) closed() bool { return g.shut.Load() }

// drain waits, after close, until no writer admitted before it is inside for a role that
// working(role) reports true. enter's increment comes before its load of shut and close's store
// comes before drain's loads (sequentially consistent atomics), so every writer either sees the
// gate shut or is seen here. The wait is a poll: it happens once in an array's life.
func (g *writeGate) drain(roles int, working func(role int) bool) {
	for {
		busy := false
		for r := range roles {
			if g.inside[r].Load() > 0 && working(r) {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}
