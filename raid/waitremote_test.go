package raid_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// lateKind is a remote member kind for the tests of AssembleOptions.WaitRemote: latetest://NAME
// opens the member set for NAME once its time has come, and until then fails as an export
// whose server does not answer (fs.ErrNotExist), after waiting until its context ends if
// block is set (a host that drops the connection attempts).
var lateKind struct {
	once sync.Once
	mu   sync.Mutex // guards the maps
	mems map[string]*lateMember
}

type lateMember struct {
	m         raid.Member
	at        time.Time // it answers from then on; zero: never
	block     bool      // an attempt waits for its deadline before it fails
	attempts  int
	deadlines []time.Time
}

func registerLate() {
	lateKind.once.Do(func() {
		lateKind.mems = map[string]*lateMember{}
		open := func(ctx context.Context, spec string, _ member.Use) (member.Member, error) {
			deadline, _ := ctx.Deadline()
			lateKind.mu.Lock()
			lm := lateKind.mems[spec]
			lm.attempts++
			lm.deadlines = append(lm.deadlines, deadline)
			ready := !lm.at.IsZero() && !time.Now().Before(lm.at)
			block := lm.block
			lateKind.mu.Unlock()
			if ready {
				return lm.m, nil
			}
			if block {
				<-ctx.Done()
			}
			return nil, fmt.Errorf("latetest: %s: %w", spec, fs.ErrNotExist)
		}
		member.Register("latetest://", member.Kind{
			Open:        func(spec string, use member.Use) (member.Member, error) { return open(context.Background(), spec, use) },
			OpenContext: open,
		})
	})
}

// lateMembers registers the members ms as latetest://NAME (fresh names per call) and
// returns their specs and records.
func lateMembers(t *testing.T, ms []*raidtest.Mem) ([]string, []*lateMember) {
	registerLate()
	specs := make([]string, len(ms))
	lms := make([]*lateMember, len(ms))
	lateKind.mu.Lock()
	defer lateKind.mu.Unlock()
	for i, m := range ms {
		specs[i] = "latetest://" + t.Name() + "/" + m.Name()
		lms[i] = &lateMember{m: m, at: time.Now()}
		lateKind.mems[specs[i]] = lms[i]
	}
	return specs, lms
}

func (lm *lateMember) record() (attempts int, deadlines []time.Time) {
	lateKind.mu.Lock()
	defer lateKind.mu.Unlock()
	return lm.attempts, append([]time.Time(nil), lm.deadlines...)
}

// TestWaitRemoteLate: a remote member that answers only some time after Assemble began — its
// host boots after the daemon's, after a power cut that left the array dirty — is waited for:
// the array assembles whole (no refusal, no rebuild), and resyncs.
func TestWaitRemoteLate(t *testing.T) {
	crashed, _, _ := crashWritten(t, "wl", raid.CreateOptions{}, 0, make([]byte, 3*testChunk))
	specs, lms := lateMembers(t, crashed)
	const late = 300 * time.Millisecond
	lms[1].at = time.Now().Add(late)
	start := time.Now()
	var told [][]string // what Waiting was told, in order
	a, err := raid.Assemble(specs, raid.AssembleOptions{WaitRemote: time.Minute,
		Waiting: func(away []string) { told = append(told, away) }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	took := time.Since(start)
	// The service manager's STATUS line: waiting for the late member, then for none.
	if want := [][]string{{specs[1]}, nil}; !reflect.DeepEqual(told, want) {
		t.Fatalf("Waiting was told %q, want %q", told, want)
	}
	st := a.Status()
	if len(st.Missing) != 0 || st.WriteHole || st.State == raid.StateDegraded {
		t.Fatalf("the late member was not waited for: %v, missing %v, write hole %v", st.State, st.Missing, st.WriteHole)
	}
	if n, _ := lms[1].record(); n < 2 || took < late {
		t.Fatalf("assembled after %v with %d attempts at the late member", took, n)
	}
	if n, _ := lms[0].record(); n != 1 {
		t.Fatalf("a member that answered at once was tried %d times", n)
	}
	waitResync(t, a)
}

// TestWaitRemoteNever: a remote member that never answers counts as missing once the wait
// has passed: a clean array assembles degraded, a dirty one is refused (ErrDirtyDegraded,
// naming the member). Every attempt ends by the wait's end (member.Kind.OpenBy's deadline),
// even one at a host that never answers; without a wait there is one attempt.
func TestWaitRemoteNever(t *testing.T) {
	const wait = 400 * time.Millisecond
	for _, tc := range []struct {
		name         string
		dirty, block bool
		wait         time.Duration
	}{
		{"clean", false, false, wait},
		{"clean-silent", false, true, wait},
		{"dirty", true, false, wait},
		{"no-wait", false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms []*raidtest.Mem
			if tc.dirty {
				ms, _, _ = crashWritten(t, "wn", raid.CreateOptions{}, 0, make([]byte, 3*testChunk))
			} else {
				ms = createMem(t, "wn", 3)
			}
			specs, lms := lateMembers(t, ms)
			lms[2].at, lms[2].block = time.Time{}, tc.block
			start := time.Now()
			a, err := raid.Assemble(specs, raid.AssembleOptions{WaitRemote: tc.wait})
			took := time.Since(start)
			n, deadlines := lms[2].record()
			// A silent host's one attempt lasts the whole wait.
			if tc.wait == 0 && n != 1 || tc.wait > 0 && (n < 2 && !tc.block || took < tc.wait) {
				t.Fatalf("wait %v: gave up after %v and %d attempts", tc.wait, took, n)
			}
			for _, d := range deadlines {
				if tc.wait == 0 && !d.IsZero() || tc.wait > 0 && (d.Before(start.Add(tc.wait)) || d.After(start.Add(took))) {
					t.Fatalf("an attempt's deadline %v (start %v, wait %v)", d, start, tc.wait)
				}
			}
			if tc.dirty {
				var dd *raid.DirtyDegradedError
				if !errors.As(err, &dd) || dd.Role != 2 || len(dd.Absent) != 1 || dd.Absent[0] != specs[2] {
					t.Fatalf("dirty, a member never came: %v", err)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if st := a.Status(); st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != 2 {
				t.Fatalf("clean, a member never came: %v, missing %v", st.State, st.Missing)
			}
		})
	}
}

// TestWaitRemoteNotLocal: a local member that is not there is not waited for.
func TestWaitRemoteNotLocal(t *testing.T) {
	ms := createMem(t, "wo", 3)
	dir := t.TempDir()
	paths := asFiles(t, ms)
	paths[1] = filepath.Join(dir, "gone.img")
	start := time.Now()
	a, err := raid.Assemble(paths, raid.AssembleOptions{WaitRemote: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if took := time.Since(start); took > 10*time.Minute || a.Status().State != raid.StateDegraded {
		t.Fatalf("a missing local member: %v after %v", a.Status().State, took)
	}
}

// TestWaitRemoteFaultyRole: a remote member whose role the others record as faulty (it failed
// before the array stopped) is not waited for once they have answered: a member of that role
// that came late would be stale, left out. The array assembles degraded at once, even while an
// attempt at the member hangs (a host that drops the connection attempts).
func TestWaitRemoteFaultyRole(t *testing.T) {
	ms := createMem(t, "wf", 3)
	a, err := raid.AssembleMembers(asMembers(ms), raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Fail(ms[2].Name()); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		m.Reopen()
	}
	specs, lms := lateMembers(t, ms)
	lms[2].at, lms[2].block = time.Time{}, true
	b, err := raid.Assemble(specs, raid.AssembleOptions{WaitRemote: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if st := b.Status(); st.State != raid.StateDegraded || len(st.Missing) != 1 || st.Missing[0] != 2 {
		t.Fatalf("role 2 recorded faulty, its member away: %v, missing %v", st.State, st.Missing)
	}
}

// TestManageWaitRemote: AddSpare (and so Replace) and ReAdd of a remote member that does
// not answer yet try it again, with assembly's backoff, for the array's WaitRemote: a member
// that answers late is added, or re-added; one that never answers is an error after the
// wait (fs.ErrNotExist), saying how long it was tried. They made one attempt before.
func TestManageWaitRemote(t *testing.T) {
	const wait = 2 * time.Second
	const late = 300 * time.Millisecond
	ms := createMem(t, "mw", 3)
	ms = append(ms, raidtest.NewMem("mwspare", memberSize), raidtest.NewMem("mwnever", memberSize))
	specs, lms := lateMembers(t, ms)
	for i, lm := range lms {
		lm.m = specNamed{lm.m, specs[i]} // as a remote member is named
	}
	a, err := raid.Assemble(specs[:3], raid.AssembleOptions{WaitRemote: wait})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	lms[4].at = time.Time{} // never
	start := time.Now()
	err = a.AddSpare(specs[4])
	if took := time.Since(start); !errors.Is(err, fs.ErrNotExist) || took < wait || !strings.Contains(err.Error(), "no answer in") {
		t.Fatalf("AddSpare of a member that never answers: %v after %v (want fs.ErrNotExist after the wait, %v)", err, took, wait)
	}
	if n, _ := lms[4].record(); n < 2 {
		t.Fatalf("AddSpare tried a member that never answers %d times", n)
	}

	if err := a.Fail(specs[0]); err != nil {
		t.Fatal(err)
	}
	lateKind.mu.Lock()
	lms[0].at = time.Now().Add(late)
	before := lms[0].attempts
	lateKind.mu.Unlock()
	if err := a.ReAdd(specs[0]); err != nil {
		t.Fatalf("ReAdd of a member that answers %v late: %v", late, err)
	}
	if n, _ := lms[0].record(); n-before < 2 {
		t.Fatalf("ReAdd of a late member: %d attempts", n-before)
	}
	waitStatus(t, a, "the re-added member active", func(st raid.Status) bool { return len(st.Missing) == 0 && st.Sync == nil })

	lateKind.mu.Lock()
	lms[3].at = time.Now().Add(late)
	lateKind.mu.Unlock()
	if err := a.AddSpare(specs[3]); err != nil {
		t.Fatalf("AddSpare of a member that answers %v late: %v", late, err)
	}
	if n, _ := lms[3].record(); n < 2 {
		t.Fatalf("AddSpare of a late member: %d attempts", n)
	}
	if s, _ := memberState(a.Status(), specs[3]); s != raid.MemberSpare {
		t.Fatalf("the late spare is %q", s)
	}
}

// specNamed is a member named by the spec it was opened from, as a remote member is.
type specNamed struct {
	raid.Member
	spec string
}

func (m specNamed) Name() string { return m.spec }
