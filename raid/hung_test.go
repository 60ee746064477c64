package raid_test

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// hang makes every write and sync of f block until the returned release runs (also at the
// end of the test).
func hang(t *testing.T, f *raidtest.Faulty) (release func()) {
	var armed atomic.Bool
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	f.SetHook(func(op raidtest.Op, off int64) {
		if armed.Load() && (op == raidtest.OpWrite || op == raidtest.OpSync) {
			<-ch
		}
	})
	armed.Store(true)
	t.Cleanup(release) // before the array's Close, registered earlier
	return release
}

// within runs fn and fails the test unless it returns nil within d (a bound on a hang, far
// above what the call needs; not a measure of speed).
func within(t *testing.T, d time.Duration, what string, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(d):
		t.Fatalf("%s did not return within %v while a member hangs", what, d)
	}
}

// waitFaulty waits (bounded) until member i is faulty, calling Status meanwhile, each call
// bounded too: Status answers from memory.
func waitFaulty(t *testing.T, a *raid.Array, i int) raid.Status {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var st raid.Status // written by within's goroutine, read after it returned
		within(t, 5*time.Second, "Status", func() error { st = a.Status(); return nil })
		if st.Members[i].State == raid.MemberFaulty {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %d not failed: %+v", i, st.Members[i])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHungMember: a member whose writes and syncs stop returning. With a member timeout, the
// watchdog fails it, and everything else goes on degraded in bounded time: status, writes to
// other stripes, FLUSH; a superblock update waiting for it gives up on it; and `fail` of it
// takes effect at once even with no timeout at all. Every byte is compared at the end.
func TestHungMember(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name+"/watchdog", func(t *testing.T) {
			opts := raid.AssembleOptions{IOOptions: mode.io}
			opts.MemberTimeout = 300 * time.Millisecond
			a, fs, _, model := faultyArray(t, 4, 32, opts)
			ss := a.Layout().StripeSize()
			p := bytes.Repeat([]byte{0x11}, int(ss))
			if _, err := a.WriteAtFUA(p, 0); err != nil { // dirty now: no superblock update below
				t.Fatal(err)
			}
			copy(model, p)
			release := hang(t, fs[2])
			stuck := make(chan error, 1)
			q := bytes.Repeat([]byte{0x22}, int(ss))
			go func() { _, err := a.WriteAt(q, ss); stuck <- err }() // its write to member 2 hangs
			copy(model[ss:], q)
			waitFaulty(t, a, 2)
			r := bytes.Repeat([]byte{0x33}, int(ss))
			within(t, 10*time.Second, "a write to another stripe", func() error {
				_, err := a.WriteAt(r, 5*ss)
				return err
			})
			copy(model[5*ss:], r)
			within(t, 10*time.Second, "Flush", a.Flush)
			release()
			if err := <-stuck; err != nil {
				t.Fatalf("the write that was under way on the hung member: %v", err)
			}
			compareArray(t, a, model)
		})
		t.Run(mode.name+"/superblock", func(t *testing.T) {
			opts := raid.AssembleOptions{IOOptions: mode.io}
			opts.MemberTimeout = 300 * time.Millisecond
			a, fs, _, model := faultyArray(t, 4, 32, opts) // clean: the first write marks it dirty
			hang(t, fs[2])
			ss := a.Layout().StripeSize()
			p := bytes.Repeat([]byte{0x44}, int(ss))
			within(t, 10*time.Second, "the first write (marking the superblocks dirty)", func() error {
				_, err := a.WriteAtFUA(p, 3*ss)
				return err
			})
			copy(model[3*ss:], p)
			waitFaulty(t, a, 2)
			compareArray(t, a, model)
		})
		t.Run(mode.name+"/fail", func(t *testing.T) {
			opts := raid.AssembleOptions{IOOptions: mode.io}
			opts.MemberTimeout = -1 // no deadline: only `fail` can help
			a, fs, _, model := faultyArray(t, 4, 32, opts)
			release := hang(t, fs[2])
			ss := a.Layout().StripeSize()
			p := bytes.Repeat([]byte{0x55}, int(ss))
			stuck := make(chan error, 1)
			go func() { _, err := a.WriteAt(p, 2*ss); stuck <- err }() // holds the superblock update
			copy(model[2*ss:], p)
			time.Sleep(100 * time.Millisecond)
			within(t, 10*time.Second, "fail of the hung member", func() error { return a.Fail("2") })
			waitFaulty(t, a, 2)
			select {
			case err := <-stuck:
				if err != nil {
					t.Fatalf("write: %v", err)
				}
			case <-time.After(10 * time.Second):
				release()
				t.Fatal("the write waiting for the superblock update did not go on once the hung member was failed")
			}
			compareArray(t, a, model)
		})
	}
}

// TestHungMembersFailArray: the array is degraded (role 0 failed) and members 1 and 2 then
// hang under one write. The watchdog fails one of them, which fails the array; the failure
// waits for the writes still under way on working members, but not for one that has hung
// past the timeout: the watchdog itself is the caller waiting there, and it must go on to
// fail the other hung member too.
func TestHungMembersFailArray(t *testing.T) {
	opts := raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}}
	opts.MemberTimeout = 300 * time.Millisecond
	a, fs, _, _ := faultyArray(t, 4, 32, opts)
	ss := a.Layout().StripeSize()
	if _, err := a.WriteAtFUA(make([]byte, ss), 0); err != nil { // dirty now
		t.Fatal(err)
	}
	if err := a.Fail("0"); err != nil {
		t.Fatal(err)
	}
	// Only their data writes hang: their superblocks still record the failures, so only
	// the watchdog can find the second one.
	for _, f := range []*raidtest.Faulty{fs[1], fs[2]} {
		ch := make(chan struct{})
		t.Cleanup(func() { close(ch) })
		f.SetHook(func(op raidtest.Op, off int64) {
			if op == raidtest.OpWrite && off >= raid.DataOffset {
				<-ch
			}
		})
	}
	// Two chunk writes in two stripes whose parity is on member 3 (left-symmetric): one
	// hangs inside its write of member 1, the other inside its write of member 2.
	l, C := a.Layout(), a.Layout().ChunkSize()
	for _, off := range []int64{0*ss + 1*C, 4*ss + 2*C} {
		if loc := l.Map(off); loc.Parity != 3 || loc.Member != 1 && loc.Member != 2 {
			t.Fatalf("offset %d maps to %+v", off, loc)
		}
		go a.WriteAt(make([]byte, C), off)
	}
	waitFaulty(t, a, 1)
	st := waitFaulty(t, a, 2)
	if st.State != raid.StateFailed {
		t.Fatalf("state %v with three roles lost", st.State)
	}
}

// TestHungSpareSync: a write that reaches what a full rebuild has rebuilt since its last
// record makes the position durable first, syncing the spare with the write's stripe locked;
// a spare whose sync hangs is failed after the member timeout, as a FLUSH's sync is, and the
// write goes on around it (it waited for ever before). Every byte is compared at the end.
func TestHungSpareSync(t *testing.T) {
	const chunks = 1024
	opts := raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1, SyncSpeedMin: 1, SyncSpeedMax: 1}}
	opts.MemberTimeout = 300 * time.Millisecond
	a, _, _, model := faultyArray(t, 4, chunks, opts)
	ss := a.Layout().StripeSize()
	p := bytes.Repeat([]byte{0x11}, int(ss))
	if _, err := a.WriteAtFUA(p, 0); err != nil { // dirty now
		t.Fatal(err)
	}
	copy(model, p)
	if err := a.Fail("1"); err != nil {
		t.Fatal(err)
	}
	spare := raidtest.NewFaulty(raidtest.NewMem("spare", raid.DataOffset+chunks*testChunk))
	var armed atomic.Bool
	ch := make(chan struct{})
	spare.SetHook(func(op raidtest.Op, off int64) {
		if armed.Load() && op == raidtest.OpSync {
			<-ch
		}
	})
	t.Cleanup(func() { close(ch) })
	if err := a.AddSpareMember(spare); err != nil {
		t.Fatal(err)
	}
	// The rebuild does its first batch (1/64 of the array), then the throttle holds it; its
	// position is not recorded before a write reaches the batch.
	waitStatus(t, a, "the rebuild's first batch", func(st raid.Status) bool {
		return st.Sync != nil && st.Sync.Done > 0
	})
	armed.Store(true)
	q := bytes.Repeat([]byte{0x22}, int(ss))
	within(t, 10*time.Second, "a write below the rebuild position (the spare's sync hung)", func() error {
		_, err := a.WriteAt(q, ss)
		return err
	})
	copy(model[ss:], q)
	waitStatus(t, a, "the spare failed and its rebuild stopped", func(st raid.Status) bool {
		s, _ := memberState(st, "spare")
		return s == raid.MemberFaulty && st.Sync == nil
	})
	compareArray(t, a, model)
}

// syncHangsAfterData makes f's syncs block, from its first data-area write on (a rebuild's or
// a re-add's write, after the superblock writes of the add), until the test ends.
func syncHangsAfterData(t *testing.T, f *raidtest.Faulty) {
	var armed atomic.Bool
	ch := make(chan struct{})
	t.Cleanup(func() { close(ch) }) // before the array's Close, registered earlier
	f.SetHook(func(op raidtest.Op, off int64) {
		if op == raidtest.OpWrite && off >= raid.DataOffset {
			armed.Store(true)
		}
		if op == raidtest.OpSync && armed.Load() {
			<-ch
		}
	})
}

// TestHungSpareSyncEnd: a rebuild that has written every stripe syncs the spare before it
// takes the role; a spare whose sync hangs is failed after the member timeout, as a FLUSH's
// sync is, and the rebuild ends (it waited for ever before, and Close with it). The array
// stays degraded and serves every byte; Close returns.
func TestHungSpareSyncEnd(t *testing.T) {
	const chunks = 64
	opts := raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}}
	opts.MemberTimeout = 300 * time.Millisecond
	a, _, _, model := faultyArray(t, 4, chunks, opts)
	if err := a.Fail("1"); err != nil {
		t.Fatal(err)
	}
	spare := raidtest.NewFaulty(raidtest.NewMem("spare", raid.DataOffset+chunks*testChunk))
	syncHangsAfterData(t, spare)
	if err := a.AddSpareMember(spare); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st raid.Status // written by within's goroutine, read after it returned
		within(t, 5*time.Second, "Status", func() error { st = a.Status(); return nil })
		if s, _ := memberState(st, "spare"); s == raid.MemberFaulty && st.Sync == nil {
			if st.LastRebuild == nil || st.LastRebuild.Err == "" || st.State != raid.StateDegraded {
				t.Fatalf("the spare failed: last rebuild %+v, state %v; want a rebuild ended by the spare's failure, degraded", st.LastRebuild, st.State)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rebuild's last sync of the spare hung and it did not end within 10 s: sync %+v, members %+v", st.Sync, st.Members)
		}
		time.Sleep(5 * time.Millisecond)
	}
	compareArray(t, a, model)
	within(t, 10*time.Second, "Close (the spare's sync still hanging)", a.Close)
}

// TestHungReAddSync: a re-add syncs the member after each piece it resyncs, with the piece's
// stripes locked; a member whose sync hangs is failed after the member timeout and the re-add
// ends, so a client write to that piece returns (it waited for ever before). Every byte is
// compared; Close returns.
func TestHungReAddSync(t *testing.T) {
	a, ms := windowArrayWith(t, "hr", raid.IOOptions{MemberTimeout: 300 * time.Millisecond})
	model, write := stripeWriter(a, readdStripes)
	for _, s := range []int64{0, 1, 2000} { // written while ms[1] is away: resynced by its re-add
		if err := write(s, byte(s)+1); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove(ms[1].Name()); err != nil {
		t.Fatal(err)
	}
	// A second open of the member's data, as the daemon's re-add opens the path again: the
	// array keeps the removed member (its own open) until Close, and closes each once.
	f := raidtest.NewFaulty(&reopened{Mem: ms[1]})
	syncHangsAfterData(t, f)
	if err := a.ReAddMember(f); err != nil {
		t.Fatal(err)
	}
	within(t, 10*time.Second, "a write to the piece being resynced (the member's sync hung)", func() error {
		return write(1, 0x77)
	})
	waitStatus(t, a, "the member failed and its re-add ended", func(st raid.Status) bool {
		s, _ := memberState(st, ms[1].Name())
		return s == raid.MemberFaulty && st.Sync == nil
	})
	compareArray(t, a, model)
	within(t, 10*time.Second, "Close (the member's sync still hanging)", a.Close)
	if err := ms[1].Close(); !errors.Is(err, raidtest.ErrClosed) {
		t.Fatalf("the removed member left open by Close: closing it again: %v, want ErrClosed", err)
	}
}

// reopened is a second open of a Mem: the same data, its own Close (a second one fails).
type reopened struct {
	*raidtest.Mem
	closed atomic.Bool
}

func (r *reopened) Close() error {
	if r.closed.Swap(true) {
		return raidtest.ErrClosed
	}
	return nil
}
