package main

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSchedBatch: schedBatch moves every thread of the process to SCHED_BATCH, the threads the
// runtime starts after it inherit the policy, and a thread under another policy (SCHED_IDLE,
// which needs no privilege) is left alone. It leaves the test process under SCHED_BATCH.
func TestSchedBatch(t *testing.T) {
	idleCh := make(chan int)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		tid := unix.Gettid()
		a, err := unix.SchedGetAttr(tid, 0)
		if err == nil {
			a.Size, a.Policy = unix.SizeofSchedAttr, unix.SCHED_IDLE
			err = unix.SchedSetAttr(tid, a, 0)
		}
		if err != nil {
			t.Errorf("SCHED_IDLE: %v", err)
			tid = -1
		}
		idleCh <- tid
		<-release
	}()
	if <-idleCh < 0 {
		return
	}
	defer close(release)
	// The threads under SCHED_IDLE: this one, and an earlier run's if its goroutine ran on the
	// main thread (which the runtime keeps, wedged, rather than end it).
	idle := map[int]bool{}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		idle[tid] = policy(t, tid) == unix.SCHED_IDLE
	}

	if err := schedBatch(); err != nil {
		t.Fatal(err)
	}
	before := map[int]bool{}
	ents, err = os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		before[tid] = true
		want := uint32(unix.SCHED_BATCH)
		if idle[tid] {
			want = unix.SCHED_IDLE
		}
		if p := policy(t, tid); p != want && p != gone {
			t.Errorf("thread %d: policy %d after schedBatch, want %d", tid, p, want)
		}
	}

	// Threads started from now on: goroutines each holding a thread of its own at once make
	// the runtime start new ones once its idle threads (earlier tests') are taken.
	hold := make(chan struct{})
	defer close(hold)
	fresh := 0
	for n := 0; fresh < 4; n++ {
		if n == 2000 {
			t.Fatalf("%d locked goroutines, %d on a thread started after schedBatch", n, fresh)
		}
		ch := make(chan int)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			ch <- unix.Gettid()
			<-hold
		}()
		tid := <-ch
		if before[tid] {
			continue
		}
		fresh++
		if p := policy(t, tid); p != unix.SCHED_BATCH {
			t.Errorf("thread %d, started after schedBatch: policy %d, want SCHED_BATCH", tid, p)
		}
	}
}

// policy is thread tid's scheduling policy, or gone if the thread has ended (an earlier
// run's locked threads end while this one lists them).
const gone = ^uint32(0)

func policy(t *testing.T, tid int) uint32 {
	a, err := unix.SchedGetAttr(tid, 0)
	if errors.Is(err, unix.ESRCH) {
		return gone
	}
	if err != nil {
		t.Errorf("thread %d: %v", tid, err)
		return gone
	}
	return a.Policy
}
