package raid

import (
	"fmt"
	"time"

	memberpkg "github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/stripe"
)

// Member states in Status.Members[i].State. They are stable strings, shown to users and in JSON.
const (
	MemberActive     = "active"
	MemberFaulty     = "faulty"     // failed: no longer read or written
	MemberSpare      = "spare"      // idle spare, takes over a failed role by itself
	MemberRebuilding = "rebuilding" // a spare being rebuilt into Role
)

// State is the state of an array.
type State int

const (
	StateClean    State = iota // no writes since assembly or since the last clean shutdown
	StateActive                // written to: the superblocks say dirty until Close
	StateDegraded              // one member missing; reads rebuild its chunks from the others
	StateFailed                // two or more roles without a working member (one being rebuilt counts): data is lost
)

// MarshalText returns the state's name, for logs and JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s State) String() string {
	switch s {
	case StateClean:
		return "clean"
	case StateActive:
		return "active"
	case StateDegraded:
		return "degraded"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// MemberStatus describes one member of the array.
type MemberStatus struct {
	Path        string
	Role        int    // the role it holds or is being rebuilt into; -1 for an idle spare
	State       string // one of the Member* constants
	Events      uint64 // the events counter of its superblock
	Device      UUID
	ReadErrors  uint64 // failed reads (served by reconstruction)
	WriteErrors uint64
	// Direct: opened with O_DIRECT (memberpkg.IsDirect, as memberpkg.SetDirect chose).
	Direct bool
	// Remote is what a remote member says of its server and its link (memberpkg.Reporter:
	// the export, connections, requests in flight, latency, reconnects); nil for a member
	// that says nothing (a file or block device).
	Remote *MemberReport
}

// MemberReport is what a member says of itself: see memberpkg.Report.
type MemberReport = memberpkg.Report

// Status is a snapshot of an array's state.
type Status struct {
	UUID    UUID
	State   State
	Dirty   bool // the superblocks say dirty (writes since assembly, or an unclean shutdown)
	Unclean bool // assembled after an unclean shutdown: parity may be inconsistent until the resync ends
	// ReadOnly: assembled read-only (AssembleOptions.ReadOnly, or a journaled array whose
	// journal is missing): every write fails.
	ReadOnly bool
	// WriteHole: assembled after an unclean shutdown while degraded. Parity of the stripes
	// being written at the crash cannot be resynced without the missing member, so chunks
	// rebuilt from it (degraded reads, a rebuild) may be wrong. Logged as an error too.
	WriteHole bool
	Events    uint64
	Layout    stripe.Layout
	Size      int64
	Members   []MemberStatus // every member incl. faulty ones and spares: by role, then spares
	Missing   []int          // roles with no working (active) member
	Sync      *Progress      // the rebuild, resync or scrub running (or waiting to) now, nil if none
	LastScrub *Progress      // the last finished or stopped scrub, nil if none
	// LastRebuild is the last finished or stopped rebuild run, nil if none (Resumed says
	// where it started).
	LastRebuild *Progress
	// LastResync is the last finished or stopped resync after an unclean shutdown, nil if none.
	LastResync *Progress
	// Bitmap describes the write-intent bitmap; nil if the array has none.
	Bitmap *BitmapStatus
	// Consistency is the crash-consistency policy the array was created with:
	// ConsistencyBitmap, ConsistencyNone or ConsistencyJournal.
	Consistency string
	// Journal describes the write journal; nil unless the policy is ConsistencyJournal.
	Journal  *JournalStatus
	Counters Counters
	// SyncSpeedMin and SyncSpeedMax bound rebuild and scrub speed, in bytes/s (SetSyncSpeed).
	SyncSpeedMin, SyncSpeedMax int64
	// AutoReAdd lists the away members that AutoReAdd watches while it runs (an empty list
	// when none is away); nil when it does not run.
	AutoReAdd []AutoReAddProbe
	// SuperblocksBusy: an update of the superblocks (or a membership change) was under way
	// for longer than Status waits, typically held up by a slow member until the member
	// timeout. Events, roles and the member list are then as of the last Status that could
	// read them; member states, error counts and everything else are current.
	SuperblocksBusy bool
}

// statusWait is how long Status waits for sbMu before it answers from the last snapshot.
const statusWait = 200 * time.Millisecond

// memberView is the part of Status read under sbMu, kept (Array.view) so that Status can
// answer without it.
type memberView struct {
	events   uint64
	unclean  bool
	uuid     UUID
	features uint32
	members  []*member
	status   []MemberStatus // by members: the superblock fields (Role, Events, Device)
}

// readView reads the memberView; the caller holds sbMu.
func (a *Array) readView() *memberView {
	v := &memberView{events: a.events, unclean: a.unclean, uuid: a.uuid}
	for _, m := range a.all() {
		v.features |= m.sb.Features
		v.members = append(v.members, m)
		v.status = append(v.status, MemberStatus{Path: m.Name(), Role: m.sb.Role, Events: m.sb.Events, Device: m.sb.DeviceUUID})
	}
	return v
}

// Status returns a snapshot of the array's state. It may be called concurrently with I/O, and
// it answers from memory: it waits at most statusWait for a superblock update under way (one
// held up by a slow member lasts up to the member timeout), then answers with the member list
// of the last snapshot (SuperblocksBusy).
func (a *Array) Status() Status {
	var v *memberView
	busy := false
	for deadline := time.Now().Add(statusWait); ; time.Sleep(time.Millisecond) {
		if a.sbMu.TryLock() {
			v = a.readView()
			a.view.Store(v)
			a.sbMu.Unlock()
			break
		}
		if time.Now().After(deadline) {
			if v, busy = a.view.Load(), true; v == nil { // no snapshot yet: wait after all
				a.sbMu.Lock()
				v = a.readView()
				a.sbMu.Unlock()
			}
			break
		}
	}
	st := Status{Events: v.events, Layout: a.layout, Size: a.size, Unclean: v.unclean, ReadOnly: a.readOnly, UUID: v.uuid,
		WriteHole: a.writeHole.Load(), SuperblocksBusy: busy}
	st.Dirty = a.dirty.Load() || v.unclean
	features := v.features
	for i, m := range v.members {
		ms := v.status[i]
		ms.ReadErrors, ms.WriteErrors = m.readErrs.Load(), m.writeErrs.Load()
		ms.Direct = memberpkg.IsDirect(m.Member)
		if r, ok := memberpkg.Base(m.Member).(memberpkg.Reporter); ok {
			rep := r.Report()
			ms.Remote = &rep
		}
		switch {
		case m.faulty.Load():
			ms.State = MemberFaulty
		case m.rebuilding.Load():
			ms.State = MemberRebuilding
		case ms.Role < 0:
			ms.State = MemberSpare
		default:
			ms.State = MemberActive
		}
		st.Members = append(st.Members, ms)
	}
	// After the members' states: a member is marked faulty before the role table counts it
	// (fail), so a member shown faulty above has its role missing here, and the array is
	// never shown active beside a faulty member (TestHungMember saw that once).
	st.Missing = a.roles.missing()
	failed := a.roles.failed()
	switch {
	case features&featureJournal != 0:
		st.Consistency = ConsistencyJournal
	case features&featureBitmap != 0:
		st.Consistency = ConsistencyBitmap
	default:
		st.Consistency = ConsistencyNone
	}
	switch {
	case failed:
		st.State = StateFailed
	case len(st.Missing) > 0:
		st.State = StateDegraded
	case st.Dirty:
		st.State = StateActive
	default:
		st.State = StateClean
	}
	a.syncMu.Lock()
	switch j := a.job; {
	case j != nil && j.running: // a scrub waiting for the resync shows as the scrub
		p := j.progress()
		st.Sync = &p
	case j != nil && j.after != nil && j.after.running: // a stopped scrub's resync goes on
		p := j.after.progress()
		st.Sync = &p
	}
	if a.lastScrub != nil {
		p := *a.lastScrub
		st.LastScrub = &p
	}
	if a.lastRebuild != nil {
		p := *a.lastRebuild
		st.LastRebuild = &p
	}
	if a.lastResync != nil {
		p := *a.lastResync
		st.LastResync = &p
	}
	st.SyncSpeedMin, st.SyncSpeedMax = a.speedMin, a.speedMax
	a.syncMu.Unlock()
	st.Counters = a.Counters()
	if a.bm != nil {
		b := a.bitmapStatus()
		st.Bitmap = &b
	}
	if a.jr != nil {
		j := a.jr.Status()
		st.Journal = &j
	}
	st.AutoReAdd = a.autoReAddStatus()
	return st
}
