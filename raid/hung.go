package raid

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// A member's record of its writes (data, trims, syncs, the bitmap, superblocks) for the
// watchdog: begin and end bracket each one with one atomic add each and no clock read, counting
// in io the writes under way (its low opsBits bits) and those completed (the rest), both in one
// word so that a look sees them together. A look (the watchdog's, every tick, and the gate's
// drain) that finds writes under way notes when it first found them with the present count of
// completed ones: while that count stays, none of the writes under way then has ended, so the
// member has been stuck since that look at least. It is never found stuck for longer than it
// has been, and at most one look later than with a clock read per write.
const (
	opsBits = 24
	opsMask = 1<<opsBits - 1
)

func (m *member) begin() { m.io.Add(1) }

func (m *member) end() { m.io.Add(1<<opsBits - 1) } // one fewer under way, one more completed

// writesUnderWay returns how many writes m has under way.
func (m *member) writesUnderWay() int64 { return m.io.Load() & opsMask }

// look looks at m's writes at time now and returns how long, at least, m has had writes under
// way with none completing; 0 if it has none under way, or completed one since the last look.
func (m *member) look(now time.Time) time.Duration {
	v := m.io.Load()
	m.lookMu.Lock()
	defer m.lookMu.Unlock()
	switch done := v >> opsBits; {
	case v&opsMask == 0:
		m.seenAt = time.Time{}
		return 0
	case m.seenAt.IsZero() || done != m.seenDone:
		m.seenDone, m.seenAt = done, now
		return 0
	}
	return now.Sub(m.seenAt)
}

// watchEvery returns the watchdog's tick for member timeout t: an eighth of it (between 10 ms and
// 500 ms), so that a member stuck for t is failed by t + 2 ticks, t/4 after (as by a look every
// quarter of t at an exact clock), and a read slower than t plus two ticks is always caught.
func watchEvery(t time.Duration) time.Duration {
	return min(max(t/8, 10*time.Millisecond), 500*time.Millisecond)
}

// watchdog fails members that stop answering: every tick (watchEvery) it looks at each working
// member's writes, and one that has had writes under way for longer than the member timeout
// with none completing is failed (ErrMemberHung). The writes themselves cannot be cancelled (a
// system call on a hung device returns when the device does); failing the member makes every
// later read and write go around it, so the array goes on degraded. It also counts its ticks
// (Array.ticks): the coarse clock of the slow-read check (readMember). Started by start when
// the array has a member timeout, stopped by Close.
func (a *Array) watchdog(ctx context.Context) {
	tick := time.NewTicker(watchEvery(a.timeout))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			a.ticks.Add(1)
			now := time.Now() // not the tick's time: a look must note when it looked
			for r := range a.roles.n() {
				m := a.roles.working(r)
				if m == nil {
					continue
				}
				if d := m.look(now); d > a.timeout {
					a.fail(m, fmt.Errorf("%w: %d writes under way, none completed for %v (limit %v)",
						memberErr(m, r, "write", -1, ErrMemberHung), m.writesUnderWay(), d.Round(time.Millisecond), a.timeout))
				}
			}
		}
	}
}

// readTook returns how long a read that began at watchdog tick t0 (Array.ticks) has taken at
// least: the whole ticks that have passed since.
func (a *Array) readTook(t0 int64) time.Duration {
	return time.Duration(max(a.ticks.Load()-t0-1, 0)) * watchEvery(a.timeout)
}

// eachMember runs fn(i, ms[i]) for every member of ms concurrently and waits for them, but
// for no longer than the member timeout (none if it is ≤ 0), and not at all for a member marked
// faulty meanwhile (by fail, the watchdog, or `raid5d fail`). A member that fn has not
// finished with by then gets ErrMemberHung in errs; its fn goes on in the background and its
// result is dropped, so fn must own what it touches (its own buffer). For superblock updates
// and syncs, which are rare next to data I/O and must never hold sbMu or a FLUSH for ever.
func (a *Array) eachMember(ms []*member, fn func(i int, m *member) error) []error {
	type result struct {
		i   int
		err error
	}
	errs := make([]error, len(ms))
	done := make([]bool, len(ms))
	results := make(chan result, len(ms)) // buffered: an abandoned fn never blocks
	var mu sync.Mutex                     // guards finished and gaveUp
	finished, gaveUp := make([]bool, len(ms)), make([]bool, len(ms))
	for i, m := range ms {
		go func() {
			m.begin()
			err := fn(i, m)
			m.end()
			mu.Lock()
			finished[i] = true
			if gaveUp[i] {
				m.abandoned.Add(-1)
			}
			mu.Unlock()
			results <- result{i, err}
		}()
	}
	var deadline <-chan time.Time
	if a.timeout > 0 {
		t := time.NewTimer(a.timeout)
		defer t.Stop()
		deadline = t.C
	}
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for left := len(ms); left > 0; {
		select {
		case r := <-results:
			errs[r.i], done[r.i] = r.err, true
			left--
			continue
		case <-deadline:
		case <-poll.C:
			waiting := false
			for i, m := range ms {
				waiting = waiting || !done[i] && !m.faulty.Load()
			}
			if waiting {
				continue
			}
		}
		mu.Lock()
		pending := 0 // finished, their result on its way: take it rather than call them hung
		for i, m := range ms {
			switch {
			case done[i]:
			case finished[i]:
				pending++
			case m.faulty.Load():
				errs[i] = fmt.Errorf("%w: failed while its write was under way", ErrMemberHung)
				gaveUp[i] = true
				m.abandoned.Add(1)
			default:
				errs[i] = fmt.Errorf("%w: no answer within %v", ErrMemberHung, a.timeout)
				gaveUp[i] = true
				m.abandoned.Add(1)
			}
		}
		mu.Unlock()
		for pending > 0 {
			if r := <-results; !gaveUp[r.i] { // gaveUp is read here only after it was last written
				errs[r.i], done[r.i] = r.err, true
				pending--
			}
		}
		break
	}
	return errs
}
