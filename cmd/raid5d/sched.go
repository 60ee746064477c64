package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// schedBatch moves every thread of the process that runs under the normal policy (SCHED_OTHER)
// to SCHED_BATCH, and so the threads the Go runtime starts from then on, which inherit their
// creator's policy; a thread the operator set otherwise (chrt, systemd's CPUSchedulingPolicy)
// is left alone, and nice values are kept. A SCHED_BATCH thread that wakes does not preempt the
// thread running on its CPU: it runs at that one's next tick or sleep.
//
// Why (issue 17, README "Members on other hosts"): the daemon wakes for every message, a
// client's request or a member's reply. On a CPU shared with its busy clients (or with the veth
// and TCP work of its sockets) each wake preempted the running client at once, so the daemon
// read one message per read(2) (and then EAGAIN), wrote one per writev and went back to sleep:
// 11-16 system calls and 100-200 µs of CPU per remote 4 KiB request, where with messages left
// to queue up for a moment one read takes several and a batch goes out in one writev (1.1-1.4
// system calls, 10-18 µs). Which of the two a round of test/bench/netns.sh ran in flipped from
// round to round; under SCHED_BATCH every round ran batched.
func schedBatch() error {
	set := map[int]bool{}
	for {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		added := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || set[tid] {
				continue
			}
			set[tid], added = true, true
			if err := batchThread(tid); err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: it ended
				return fmt.Errorf("SCHED_BATCH for thread %d: %w", tid, err)
			}
		}
		// A thread started during the pass by one not yet moved may be under the normal
		// policy: pass again until a pass finds no thread it has not seen.
		if !added {
			return nil
		}
	}
}

// batchThread moves thread tid from SCHED_OTHER to SCHED_BATCH, keeping its nice value.
func batchThread(tid int) error {
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return err
	}
	if a.Policy != unix.SCHED_NORMAL {
		return nil
	}
	a.Size = unix.SizeofSchedAttr
	a.Policy = unix.SCHED_BATCH
	return unix.SchedSetAttr(tid, a, 0)
}
