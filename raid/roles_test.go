package raid

import (
	"errors"
	"testing"
)

// namedMember is a Member that only has a name: the role table never does I/O.
type namedMember struct {
	Member
	name string
}

func (m namedMember) Name() string { return m.name }

// TestRoleTable: the role table's answers for a whole array, one missing role, a role being
// rebuilt (usable below the rebuild position only, so lost in the last stripe), and two lost
// roles, which recount decides is a failed array, shutting the gate for good.
func TestRoleTable(t *testing.T) {
	const stripes = 10
	var t4 roleTable
	t4.init(4, stripes, 0)
	fails := 0
	t4.onFail = func() { fails++ }
	ms := make([]*member, 4)
	for r := range ms {
		ms[r] = &member{Member: namedMember{name: string(rune('a' + r))}}
		t4.set(r, ms[r])
	}
	check := func(what string, wantMissingAt5, wantLostAt5, wantLost int, wantFailed bool) {
		t.Helper()
		if got := t4.missingAt(5); got != wantMissingAt5 {
			t.Errorf("%s: missingAt(5) = %d, want %d", what, got, wantMissingAt5)
		}
		if got := t4.lostAt(5); got != wantLostAt5 {
			t.Errorf("%s: lostAt(5) = %d, want %d", what, got, wantLostAt5)
		}
		if got := t4.lost(nil); got != wantLost {
			t.Errorf("%s: lost(nil) = %d, want %d", what, got, wantLost)
		}
		if got := t4.failed(); got != wantFailed {
			t.Errorf("%s: failed() = %v, want %v", what, got, wantFailed)
		}
		if ok := t4.enter(0); ok == wantFailed {
			t.Errorf("%s: enter = %v with failed %v", what, ok, wantFailed)
		} else if ok {
			t4.leave(0)
		}
	}

	if t4.recount() {
		t.Fatal("recount of a whole array says failed")
	}
	check("whole", -1, 0, 0, false)
	if t4.degraded() || t4.missing() != nil {
		t.Fatalf("whole: degraded %v, missing %v", t4.degraded(), t4.missing())
	}
	if err := t4.checkLoss(ms[1], "failing b"); err != nil {
		t.Fatalf("whole: losing one member: %v", err)
	}

	// Role 1 fails: marked without sbMu, counted at once, before the recount.
	if t4.markFaulty(ms[1]) {
		t.Fatal("markFaulty: already faulty")
	}
	if !t4.markFaulty(ms[1]) {
		t.Fatal("markFaulty twice: not already faulty")
	}
	if t4.missingAt(5) != 1 {
		t.Fatalf("missingAt(5) = %d before the recount, want 1", t4.missingAt(5))
	}
	if t4.recount() {
		t.Fatal("recount with one role lost says failed")
	}
	check("one faulty", 1, 1, 1, false)
	if got := t4.working(1); got != nil {
		t.Fatalf("working(1) = %v for a faulty member", got)
	}
	if err := t4.checkLoss(ms[2], "failing c"); !errors.Is(err, ErrWouldFail) {
		t.Fatalf("degraded: losing a second member: %v, want ErrWouldFail", err)
	}

	// A spare is being rebuilt into role 1, up to stripe 6: usable below it only.
	sp := &member{Member: namedMember{name: "spare"}}
	sp.rebuilding.Store(true)
	t4.setRebuilt(6)
	t4.set(1, sp)
	t4.recount()
	if t4.usable(1, 5) != sp || t4.usable(1, 6) != nil {
		t.Fatalf("rebuilding to 6: usable(1, 5) = %v, usable(1, 6) = %v", t4.usable(1, 5), t4.usable(1, 6))
	}
	check("rebuilding", -1, 0, 1, false) // stripe 5 is below the position: whole there
	if got, want := t4.missing(), []int{1}; len(got) != 1 || got[0] != want[0] {
		t.Fatalf("rebuilding: missing() = %v, want %v", got, want)
	}
	if states, rebuilding := t4.states(); !rebuilding || states[1] != roleRebuilding || states[0] != 0 {
		t.Fatalf("rebuilding: states %v, %v", states[:4], rebuilding)
	}
	if t4.roleOf(sp) != 1 || t4.named("1") != sp || t4.named("spare") != sp || t4.named("x") != nil {
		t.Fatal("rebuilding: roleOf or named does not find the spare")
	}
	// Losing another member now would fail the array: the rebuilding role is lost above 6.
	if err := t4.checkLoss(ms[3], "failing d"); !errors.Is(err, ErrWouldFail) {
		t.Fatalf("rebuilding: losing another member: %v, want ErrWouldFail", err)
	}

	// Role 3 fails during the rebuild: the array has failed (lost in the last stripe),
	// though stripe 5 still has every role but 3.
	t4.markFaulty(ms[3])
	if !t4.recount() {
		t.Fatal("recount with a role lost during a rebuild does not say failed")
	}
	check("failed", 3, 1, 2, true)
	if fails != 1 {
		t.Fatalf("onFail ran %d times, want 1", fails)
	}
	t4.drain() // nothing inside: returns at once

	// Shutting is final, even if a role came back.
	t4.set(3, &member{Member: namedMember{name: "new"}})
	t4.recount()
	if !t4.failed() || t4.enter(3) {
		t.Fatal("the gate opened again after the array failed")
	}
}
