package test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestReAdd: the real binary's `raid5d re-add`. A member is failed under `raid5d serve`,
// qemu-io writes 10 whole stripes (1% of the array's) through NBD, and the member is
// re-added: the daemon resyncs exactly those stripes' chunks onto it (status's last rebuild:
// re_add, resynced), every byte reads back with another member failed, and every stripe's
// parity matches its data on the member files (a skipped stripe would not).
func TestReAdd(t *testing.T) {
	a, s := servePrefilled(t)
	waitFor(t, "the bitmap's cleaner to clear the fill's bits", 60*time.Second, s.proc, func() bool {
		return bitsSet(t, s) == 0
	})
	s.mustManage("fail", a.members[2])
	stripes := []int64{3, 40, 41, 77, 150, 300, 512, 700, 901, 1007} // of 1008
	var w, r []qemuOp
	for i, st := range stripes {
		p := byte(0x40 + i)
		w = append(w, qemuOp{kind: "write", off: st * stripeData, n: stripeData, pattern: p})
		r = append(r, qemuOp{kind: "read", off: st * stripeData, n: stripeData, pattern: p})
	}
	qemuIO(t, s.uri, w)
	time.Sleep(5 * time.Second) // the cleaner runs every second, clearing regions idle 3 s: not these
	if n := bitsSet(t, s); n != len(stripes) {
		t.Fatalf("%d write-intent bits set while degraded, want the %d written stripes'", n, len(stripes))
	}
	s.mustManage("re-add", a.members[2])
	s.waitStatus("the re-add to finish", 60*time.Second, (*r5Status).healthy)
	if lr := s.status().LastRebuild; lr == nil || !lr.ReAdd || lr.Resynced != int64(len(stripes))*chunkSize {
		t.Fatalf("last rebuild %+v, want a re-add of the %d written stripes' chunks (%d bytes)",
			lr, len(stripes), int64(len(stripes))*chunkSize)
	}
	s.mustManage("fail", a.members[0]) // reads of role 0 now use the re-added member
	qemuIO(t, s.uri, append(r, qemuOp{kind: "read", off: 4 * stripeData, n: 30 * stripeData / 2, pattern: 0x11}))
	s.stop()
	checkParity(t, a)
}

// servePrefilled serves a new array whose write-intent regions are one stripe each (so that
// a re-add's resync shows which stripes it took) and writes its first 16 MiB with qemu-io,
// pattern 0x11.
func servePrefilled(t *testing.T) (*array, *server) {
	t.Helper()
	needRaid5d(t)
	need(t, "qemu-io")
	a := newArrayWith(t, "--bitmap-region", fmt.Sprint(stripeData))
	s := a.serve(t)
	qemuIO(t, s.uri, []qemuOp{{kind: "write", off: 0, n: 16 << 20, pattern: 0x11}})
	return a, s
}

// bitsSet is the number of write-intent bits the daemon has set now (status --json).
func bitsSet(t *testing.T, s *server) int {
	t.Helper()
	out, _, _ := s.manageSplit("status", "--json")
	var st struct {
		Bitmap *struct {
			Set int `json:"set"`
		} `json:"bitmap"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Bitmap == nil {
		t.Fatalf("status --json: %v, no bitmap\n%s", err, out)
	}
	return st.Bitmap.Set
}

// TestReAddKilled: raid5d is SIGKILLed in the middle of a re-add's resync (slowed to 1 MiB/s);
// the next serve continues it from its checkpoint as a full rebuild, and every byte written
// before, while degraded and after reads back with another member failed, and every stripe's
// parity matches on the member files.
func TestReAddKilled(t *testing.T) {
	a, s := servePrefilled(t)
	s.mustManage("fail", a.members[2])
	var w, r []qemuOp
	for st := int64(100); st < 1008; st += 2 { // 454 whole stripes: 28 MiB to resync
		p := byte(st)
		w = append(w, qemuOp{kind: "write", off: st * stripeData, n: stripeData, pattern: p})
		r = append(r, qemuOp{kind: "read", off: st * stripeData, n: stripeData, pattern: p})
	}
	qemuIO(t, s.uri, w)
	s.mustManage("rebuild", "--speed-min", "1M", "--speed-max", "1M")
	s.mustManage("re-add", a.members[2])
	st := s.waitStatus("the re-add under way", 60*time.Second, func(st *r5Status) bool {
		return st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Done*10 >= st.Sync.Total*3
	})
	if st.Sync.Done >= st.Sync.Total {
		t.Fatalf("re-add finished before it could be interrupted: %+v", st.Sync)
	}
	s.kill()

	s = a.serve(t, "--sync-speed-max", "4M")
	if st := s.status(); st.Sync == nil || st.Sync.Kind != "rebuild" || st.Sync.Done <= 0 {
		t.Fatalf("after the restart: sync %+v, want the rebuild continuing from the re-add's checkpoint", st.Sync)
	}
	s.mustManage("rebuild", "--speed-min", "400M", "--speed-max", "1G")
	s.waitStatus("the resumed rebuild to finish", 60*time.Second, (*r5Status).healthy)
	s.mustManage("fail", a.members[0])
	qemuIO(t, s.uri, append(r, qemuOp{kind: "read", off: 0, n: 100 * stripeData / 2, pattern: 0x11}))
	s.stop()
	checkParity(t, a)
}
