package raid

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Defaults of AutoReAddOptions.
const (
	DefaultAutoReAddInterval    = 2 * time.Second
	DefaultAutoReAddMaxInterval = time.Minute
	// autoReAddFlapWindow: each automatic re-add of a member within it doubles the first
	// delay before the member is probed again after it fails once more.
	autoReAddFlapWindow = 10 * time.Minute
)

// AutoReAddOptions configure AutoReAdd.
type AutoReAddOptions struct {
	// Specs are the member specs the array was assembled from: a remote one that is not a
	// member of the array now (it was missing, or stale, at assembly) is probed too. The
	// array's own faulty remote members are probed whatever Specs says.
	Specs []string
	// Interval is how long after a member is found away it is first probed, and how often
	// the array is looked at for members newly away; each probe that finds the member not
	// answering doubles the delay to the next, up to MaxInterval. Zero: the defaults.
	Interval, MaxInterval time.Duration
}

// AutoReAddProbe is one member that AutoReAdd watches (Status.AutoReAdd).
type AutoReAddProbe struct {
	Member string
	Probes int       // probes made since it was found away
	Next   time.Time // the next probe; zero when Refused
	// Err is why the last probe did not re-add it (it does not answer; its writes from before
	// it failed are still under way; or the refusal), nil before the first probe.
	Err error
	// Refused: it answered, but the array cannot re-add it (ErrCannotReAdd: another array's
	// superblock, events the bitmap cannot bridge, its role held by another member): it is
	// probed no more and left to the operator (ReAdd once it is put right, or AddSpare for a
	// full rebuild).
	Refused bool
}

// autoReAdder is the state of a running AutoReAdd, which Status reads.
type autoReAdder struct {
	mu     sync.Mutex // guards probes, delay and flaps
	probes []*AutoReAddProbe
	delay  map[string]time.Duration // by member: the delay before its next probe
	flaps  map[string][]time.Time   // by member: its automatic re-adds in the flap window
}

// AutoReAdd brings back, by itself, remote members that failed or were missing at assembly,
// as ReAdd does when an operator asks, until ctx is done or the array is closed. A member
// whose spec names no local file (a remote member: SpecPath is "") and that is away — faulty
// in a role that has no working member (not one an operator failed: Fail and Replace mark
// those), or one of opts.Specs that is not in the array — is probed: opened again
// (OpenMember), with a delay from opts.Interval that doubles after each probe that finds
// it not answering, up to opts.MaxInterval. When it answers, it is re-added through ReAdd's
// checks (this array's UUID, its own role, an events counter the write-intent bitmap can
// bridge) and only the bitmap's regions are resynced onto it; the log says so. When ReAdd
// refuses it (ErrCannotReAdd), the log says why and it is probed no more: the array never
// rebuilds a member in full by itself, since one that comes back wrong (another disk under
// the name, a stale copy) may be exactly what an operator should look at first. A member that
// fails again soon after it came back is probed less and less often (each automatic re-add in
// the last 10 minutes doubles the first delay). Local members are not probed: a local disk
// that failed is still there, failing, and would be re-added only to fail again.
//
// AutoReAdd returns at once for an array without a bitmap or assembled read-only (nothing can
// be re-added), else when ctx is done or the array is closed; a probe under way then is
// left to finish by itself (within the member timeout), and closed. Status.AutoReAdd shows the
// members being probed while it runs. One AutoReAdd runs at a time: a second returns at once.
func (a *Array) AutoReAdd(ctx context.Context, opts AutoReAddOptions) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultAutoReAddInterval
	}
	if opts.MaxInterval <= 0 {
		opts.MaxInterval = DefaultAutoReAddMaxInterval
	}
	opts.MaxInterval = max(opts.MaxInterval, opts.Interval)
	switch {
	case a.bm == nil:
		a.log.Warn("raid: auto-re-add: the array has no write-intent bitmap, so no member can be re-added; members that come back are left to the operator")
		return
	case a.readOnly:
		return
	}
	ar := &autoReAdder{delay: map[string]time.Duration{}, flaps: map[string][]time.Time{}}
	if !a.auto.CompareAndSwap(nil, ar) {
		return
	}
	defer a.auto.Store(nil)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		away, ok := a.awayRemote(opts.Specs)
		if !ok {
			return // closed
		}
		now := time.Now()
		for _, p := range ar.track(away, now, opts) {
			if !a.probe(ctx, ar, p, opts) {
				return
			}
		}
		t.Reset(ar.untilNext(time.Now(), opts.Interval))
	}
}

// awayRemote returns the remote members AutoReAdd probes now (see there): ok is false once the
// array is closed.
func (a *Array) awayRemote(specs []string) (names []string, ok bool) {
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed {
		return nil, false
	}
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	known := map[string]bool{}
	for _, m := range append(a.all(), a.retired...) {
		known[m.Name()] = true
	}
	for _, m := range a.all() {
		r := m.sb.Role
		if !m.faulty.Load() || m.byRequest.Load() || SpecPath(m.Name()) != "" ||
			r < 0 || r >= a.roles.n() || a.roles.working(r) != nil || slices.Contains(names, m.Name()) {
			continue
		}
		names = append(names, m.Name())
	}
	for _, s := range specs {
		if SpecPath(s) == "" && !known[s] && !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	return names, true
}

// track makes the probes the members in away, dropping those no longer away, and returns the
// probes due at now (none of them refused).
func (ar *autoReAdder) track(away []string, now time.Time, opts AutoReAddOptions) []*AutoReAddProbe {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	kept := ar.probes[:0]
	for _, p := range ar.probes {
		if slices.Contains(away, p.Member) {
			kept = append(kept, p)
		} else {
			delete(ar.delay, p.Member)
		}
	}
	ar.probes = kept
	for _, name := range away {
		if slices.ContainsFunc(ar.probes, func(p *AutoReAddProbe) bool { return p.Member == name }) {
			continue
		}
		flaps := slices.DeleteFunc(ar.flaps[name], func(t time.Time) bool { return now.Sub(t) > autoReAddFlapWindow })
		ar.flaps[name] = flaps
		d := opts.Interval
		for range flaps {
			d = min(2*d, opts.MaxInterval)
		}
		ar.delay[name] = d
		ar.probes = append(ar.probes, &AutoReAddProbe{Member: name, Next: now.Add(d)})
	}
	var due []*AutoReAddProbe
	for _, p := range ar.probes {
		if !p.Refused && !now.Before(p.Next) {
			due = append(due, p)
		}
	}
	return due
}

// untilNext is how long to wait for the next probe due, at most every.
func (ar *autoReAdder) untilNext(now time.Time, every time.Duration) time.Duration {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	d := every
	for _, p := range ar.probes {
		if !p.Refused {
			d = min(d, max(p.Next.Sub(now), 0))
		}
	}
	return d
}

// probe opens p's member and re-adds it; false when AutoReAdd must stop (ctx done, the array
// closed).
func (a *Array) probe(ctx context.Context, ar *autoReAdder, p *AutoReAddProbe, opts AutoReAddOptions) bool {
	name := p.Member
	m, err := openCtx(ctx, name)
	if err != nil && ctx.Err() != nil {
		return false
	}
	if err == nil {
		err = a.reAddLocked(func() error { return a.reAddWith(name, m) })
		if err != nil {
			m.Close()
		}
	}
	away := true
	if errors.Is(err, ErrCannotReAdd) {
		// Refused because it is back already (an operator re-added it meanwhile)?
		names, _ := a.awayRemote(opts.Specs)
		away = slices.Contains(names, name)
	}
	now := time.Now()
	ar.mu.Lock()
	defer ar.mu.Unlock()
	p.Probes++
	drop := func() {
		ar.probes = slices.DeleteFunc(ar.probes, func(x *AutoReAddProbe) bool { return x == p })
		delete(ar.delay, name)
	}
	switch {
	case err == nil:
		ar.flaps[name] = append(ar.flaps[name], now)
		drop()
		a.log.Info("raid: auto-re-add: an away member answers again and was re-added; resyncing what the bitmap marked", "member", name, "probes", p.Probes)
		return true
	case !away:
		drop()
		return true
	case errors.Is(err, ErrClosed), errors.Is(err, ErrReadOnly):
		return false
	case errors.Is(err, ErrCannotReAdd):
		p.Err, p.Refused, p.Next = err, true, time.Time{}
		a.log.Warn("raid: auto-re-add: an away member answers again but cannot be re-added; left to the operator (raid5d add rebuilds it in full)",
			"member", name, "err", err)
		return true
	}
	d := min(2*ar.delay[name], opts.MaxInterval)
	ar.delay[name] = d
	if p.Probes == 1 {
		a.log.Info("raid: auto-re-add: an away member does not answer yet; probing it with backoff", "member", name, "err", err, "next_in", d)
	} else {
		a.log.Debug("raid: auto-re-add: probe", "member", name, "err", err, "next_in", d)
	}
	p.Err, p.Next = err, now.Add(d)
	return true
}

// openCtx opens the member spec names for use (OpenMember), returning early when ctx is done:
// an open still under way then finishes by itself (within the member timeout: a remote
// kind's dial and handshake have that deadline) and its member is closed.
func openCtx(ctx context.Context, spec string) (Member, error) {
	type opened struct {
		m   Member
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		m, err := OpenMember(spec, false)
		ch <- opened{m, err}
	}()
	select {
	case o := <-ch:
		if o.err != nil {
			return nil, &MemberError{Member: spec, Role: -1, Op: "open", Off: -1, Err: o.err}
		}
		return o.m, nil
	case <-ctx.Done():
		go func() {
			if o := <-ch; o.err == nil {
				o.m.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// autoReAddStatus is Status.AutoReAdd: nil unless AutoReAdd runs.
func (a *Array) autoReAddStatus() []AutoReAddProbe {
	ar := a.auto.Load()
	if ar == nil {
		return nil
	}
	ar.mu.Lock()
	defer ar.mu.Unlock()
	ps := make([]AutoReAddProbe, 0, len(ar.probes))
	for _, p := range ar.probes {
		ps = append(ps, *p)
	}
	return ps
}
