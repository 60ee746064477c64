package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"
)

// r5AutoReAdd is status --json's auto_re_add: the away members serve --auto-re-add probes.
type r5AutoReAdd struct {
	Members []struct {
		Member  string `json:"member"`
		Probes  int    `json:"probes"`
		Refused bool   `json:"refused"`
	} `json:"members"`
}

// autoReAdd is the daemon's auto_re_add, nil without --auto-re-add.
func (s *server) autoReAdd() *r5AutoReAdd {
	s.t.Helper()
	out, errOut, code := s.manageSplit("status", "--json")
	var st struct {
		AutoReAdd *r5AutoReAdd `json:"auto_re_add"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("raid5d status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	return st.AutoReAdd
}

// TestAutoReAdd: serve --auto-re-add. A member's server (nbdkit) is SIGKILLed, the array is
// written while it is away (10 whole stripes, 1% of the array) and fails the member; the
// server comes back on the same file, and the daemon re-adds the member by itself, resyncing
// exactly those stripes' chunks (status: last_rebuild re_add, resynced), logging it. Then
// every byte reads back with each other member failed in turn (by request: not re-added
// automatically, but by hand).
func TestAutoReAdd(t *testing.T) {
	needRaid5d(t)
	need(t, "nbdkit", "nbd-server")
	ms := newRemoteMembers(t)
	// a write-intent region per stripe: the re-add's resync shows which stripes it took
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K", "--bitmap-region", fmt.Sprint(stripeData)}, uris(ms)...)...)
	a := &array{dir: t.TempDir(), members: uris(ms)}
	s := a.serve(t, "--auto-re-add", "--auto-re-add-interval", "200ms", "--stripe-cache", "off", "--member-timeout", "5s")
	if ar := s.autoReAdd(); ar == nil || len(ar.Members) != 0 {
		t.Fatalf("auto_re_add %+v with every member active, want on and probing none", ar)
	}
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 16 << 20
	model := make([]byte, size)
	rand.NewChaCha8([32]byte{31}).Read(model)
	if err := c.writeAt(model, 0, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bitmap's cleaner to clear the fill's bits", time.Minute, s.proc, func() bool {
		return bitsSet(t, s) == 0
	})

	ms[1].p.stop(syscall.SIGKILL, stopGrace)
	stripes := []int64{3, 20, 21, 40, 60, 70, 80, 81, 82, 84} // of the 16 MiB's 85
	for i, st := range stripes {
		p := model[st*stripeData : (st+1)*stripeData]
		rand.NewChaCha8([32]byte{byte(i)}).Read(p)
		if err := c.writeAt(p, uint64(st*stripeData), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	s.waitStatus("member 1 failed", time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(ms[1].uri)
		return state == "faulty"
	})
	if n := bitsSet(t, s); n != len(stripes) {
		t.Fatalf("%d write-intent bits set while degraded, want the %d written stripes'", n, len(stripes))
	}
	s.waitStatus("member 1 probed", time.Minute, func(*r5Status) bool {
		ar := s.autoReAdd()
		return ar != nil && len(ar.Members) == 1 && ar.Members[0].Member == ms[1].uri && ar.Members[0].Probes > 0
	})

	ms[1].start(t)
	st := s.waitStatus("member 1 re-added by itself", 2*time.Minute, func(st *r5Status) bool {
		state, _, _ := st.member(ms[1].uri)
		return state == "active" && st.healthy() && st.LastRebuild != nil
	})
	if lr := st.LastRebuild; !lr.ReAdd || lr.Resynced != int64(len(stripes))*chunkSize {
		t.Fatalf("last rebuild %+v, want a re-add of the %d written stripes' chunks (%d bytes)", lr, len(stripes), int64(len(stripes))*chunkSize)
	}
	logged := false
	for _, line := range strings.Split(s.out.String(), "\n") {
		var r map[string]any
		if !strings.Contains(line, "auto-re-add") || json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		msg, _ := r["msg"].(string)
		logged = logged || strings.Contains(msg, "re-added") && r["member"] == ms[1].uri
	}
	if !logged {
		t.Errorf("the daemon did not log the automatic re-add of %s:\n%s", ms[1].uri, s.out.String())
	}

	for j, m := range ms {
		if j == 1 {
			continue
		}
		s.mustManage("fail", m.uri)
		time.Sleep(time.Second) // five looks at the array: a member failed by request stays failed
		if state, _, _ := s.status().member(m.uri); state != "faulty" {
			t.Fatalf("member %d failed by request: %q, want faulty (not re-added automatically)", j, state)
		}
		if err := checkModel(c, model); err != nil {
			t.Fatalf("member %d failed: %v", j, err)
		}
		s.mustManage("re-add", m.uri)
		s.waitStatus("member re-added", time.Minute, (*r5Status).healthy)
	}
	c.disconnect()
	s.stop()
}
