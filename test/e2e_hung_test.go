package test

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// TestHungMember: a member whose I/O starts taking 8 s each (the faulty: spec's delay, while
// its control file exists) under a daemon with --member-timeout 1s. The watchdog fails it
// within a few seconds; meanwhile `raid5d status` answers promptly every time, and another
// client's writes and FLUSH go on degraded without waiting for the member. The write that was
// inside the slow member's system call returns when it does. Every byte reads back. Before,
// writes had no deadline: the member stayed active and every write that touched it waited.
func TestHungMember(t *testing.T) {
	needRaid5d(t)
	a := newArray(t)
	ctl := a.dir + "/slow-on"
	spec := "faulty:" + a.members[2] + "?delay=8s&ctl=" + ctl
	s := a.withSpec(2, spec).serve(t, "--stripe-cache", "off", "--member-timeout", "1s")
	b, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const stripes = 16
	model := make([]byte, stripes*stripeData)
	for i := range model {
		model[i] = byte(i*13 + i/4093)
	}
	if err := b.writeAt(model[:8*stripeData], 0, true); err != nil {
		t.Fatal(err)
	}

	touch(t, ctl) // member 2 now takes 8 s per operation
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slow := make(chan error, 1)
	go func() { slow <- c.writeAt(model[10*stripeData:11*stripeData], 10*stripeData, true) }()

	deadline := time.Now().Add(20 * time.Second)
	for {
		t0 := time.Now()
		st := s.status()
		if d := time.Since(t0); d > 5*time.Second {
			t.Fatalf("raid5d status took %v while a member hangs", d)
		}
		if state, _, _ := st.member(a.members[2]); state == "faulty" {
			if st.State != "degraded" {
				t.Fatalf("array %q after the hung member was failed, want degraded", st.State)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hung member was not failed within 20 s (member timeout 1 s)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The other client goes on, degraded, without waiting for the slow member: each of these
	// would take 8 s or more if it did.
	t0 := time.Now()
	if err := b.writeAt(model[12*stripeData:13*stripeData], 12*stripeData, true); err != nil {
		t.Fatalf("degraded write: %v", err)
	}
	if err := b.flush(); err != nil {
		t.Fatalf("FLUSH with a hung member failed: %v", err)
	}
	if d := time.Since(t0); d > 6*time.Second {
		t.Fatalf("a write and a FLUSH took %v: they waited for the failed member", d)
	}
	select {
	case err := <-slow:
		if err != nil {
			t.Fatalf("the write that was under way on the slow member: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write under way on the slow member never returned")
	}
	os.Remove(ctl)
	for _, r := range [][2]int{{0, 8}, {10, 11}, {12, 13}} {
		off, n := r[0]*stripeData, (r[1]-r[0])*stripeData
		got, err := b.readAt(uint64(off), uint32(n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model[off:off+n]) {
			t.Fatalf("stripes %d-%d: wrong data at byte %d", r[0], r[1], off+firstDiff(got, model[off:off+n]))
		}
	}
	b.disconnect()
	c.disconnect()
}
