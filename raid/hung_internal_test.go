package raid

import (
	"testing"
	"time"
)

// TestLook: a look finds a member stuck only for as long as writes have been under way with
// none completing, counted from the first look that found them (never from an earlier look
// that found the member idle); writes begun meanwhile do not reset it (so a member that keeps
// being asked but never answers still ages past the timeout), a completion does.
func TestLook(t *testing.T) {
	var m member
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for _, st := range []struct {
		do   func()
		at   int
		want int // seconds
	}{
		{nil, 0, 0},      // idle
		{m.begin, 5, 0},  // first found under way: since now, not since the idle look
		{nil, 7, 2},      //
		{m.begin, 8, 3},  // another asked: still stuck since 5
		{m.end, 9, 0},    // one completed
		{nil, 12, 3},     // the other one since 9
		{m.end, 13, 0},   // idle again
		{m.begin, 20, 0}, //
		{nil, 21, 1},     //
	} {
		if st.do != nil {
			st.do()
		}
		if got := m.look(at(st.at)); got != time.Duration(st.want)*time.Second {
			t.Fatalf("look at %ds: %v, want %ds", st.at, got, st.want)
		}
	}
	if n := m.writesUnderWay(); n != 1 {
		t.Fatalf("%d writes under way, want 1", n)
	}
}
