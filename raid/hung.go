package raid

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// A member's clock of its writes (data, trims, syncs, the bitmap, superblocks) for the
// watchdog: begin and end bracket each one. since is when the member last completed an operation, or
// became busy after being idle; with ops > 0 and since older than the member timeout, nothing
// has completed for that long although something was asked: the member hangs. Costs two
// atomic adds and two clock reads per operation.
func (m *member) begin() {
	if m.ops.Load() == 0 {
		m.since.Store(time.Now().UnixNano())
	}
	m.ops.Add(1)
}

func (m *member) end() {
	m.since.Store(time.Now().UnixNano())
	m.ops.Add(-1)
}

// stuckFor reports how long m has had operations under way with none completing, or 0.
func (m *member) stuckFor(now time.Time) time.Duration {
	if m.ops.Load() == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, m.since.Load()))
}

// watchdog fails members that stop answering: every quarter of the member timeout it looks at
// each working member's clock, and one that has had writes under way for longer than the
// timeout with none completing is failed (ErrMemberHung). The writes themselves cannot be
// cancelled (a system call on a hung device returns when the device does); failing the member
// makes every later read and write go around it, so the array goes on degraded. Started by
// start when the array has a member timeout, stopped by Close.
func (a *Array) watchdog(ctx context.Context) {
	tick := time.NewTicker(min(max(a.timeout/4, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			for r := range a.roles.n() {
				m := a.roles.working(r)
				if m == nil {
					continue
				}
				if d := m.stuckFor(now); d > a.timeout {
					a.fail(m, fmt.Errorf("%w: %d writes under way, none completed for %v (limit %v)",
						memberErr(m, r, "write", -1, ErrMemberHung), m.ops.Load(), d.Round(time.Millisecond), a.timeout))
				}
			}
		}
	}
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
