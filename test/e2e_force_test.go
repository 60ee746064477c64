package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Force-assembly (serve --force) and stale members, with the real binary (issue 13, items 6
// and 11).

// tmpfsDir mounts a tmpfs of size bytes on a fresh directory for the test (unmounted by a
// cleanup). It needs root; without it the test is skipped (failed with RAID5D_REQUIRE_TOOLS=1).
func tmpfsDir(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "mounting a tmpfs needs root")
	}
	need(t, "mount", "umount")
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	runTool(t, "mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "tmpfs", dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	return dir
}

// TestForceAfterENOSPC: four members share a small tmpfs; writes fill it until the members
// fail with ENOSPC, two or more, and the array fails. The data flushed before is all on disk.
// They fail in one of two orders, as the member writes of a batch race: one member first (the
// array goes on degraded until the next batch fails another), or two together in one batch,
// neither failure recorded in the other's superblock (the same events counter). After space
// is freed, offline status says failed and names what serve --force would trust, serve refuses
// (naming --force and what it would do) and writes nothing; serve --force comes up, trusting
// the members that stopped only with the array — both of those that failed together, or the
// second to fail — and rebuilding the one that failed first, if one did; every flushed byte
// reads back through NBD before and after the rebuild and resync, and scrub check then finds
// 0 mismatches. raid's TestForceTwoTogether makes each order happen on purpose.
func TestForceAfterENOSPC(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("raid5d only")
	}
	// The members fill what the ballast leaves (about 6 MiB each); once it is deleted the
	// rebuild has room to write a whole member (it writes the holes too).
	const fsSize, ballastSize = 96 << 20, 72 << 20
	dir := tmpfsDir(t, fsSize)
	// Ballast to delete once the members have filled the rest.
	ballast := filepath.Join(dir, "ballast")
	if err := os.WriteFile(ballast, bytes.Repeat([]byte{0x5a}, ballastSize), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &array{dir: dir}
	for i := range memberCount {
		a.members = append(a.members, filepath.Join(dir, fmt.Sprintf("member%d.img", i)))
	}
	runTool(t, raid5dBin, append([]string{"create", "--chunk", "64K", "--layout", "left-symmetric", "--size", "64M"}, a.members...)...)

	// Mapped reads off: reading a tmpfs hole through a mapping allocates a page, and the
	// rebuild later reads the members' holes.
	flags := []string{"--mapped-reads=false", "--sync-speed-min", "200M", "--sync-speed-max", "1G"}
	s := a.serve(t, flags...)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	// Whole stripes, each flushed before the next: flushed is how far the array holds
	// durable data; the write in flight at the failure is never acknowledged.
	const piece = 4 * stripeData
	data := make([]byte, 0, arraySize)
	flushed := 0
	var failure error
	for i := 0; len(data)+piece <= arraySize; i++ {
		p := make([]byte, piece)
		for j := range p {
			p[j] = byte(i*131 + j*7 + j/4093)
		}
		if failure = c.writeAt(p, uint64(len(data)), false); failure == nil {
			failure = c.flush()
		}
		if failure != nil {
			break
		}
		data = append(data, p...)
		flushed = len(data)
	}
	if !errors.Is(failure, nbdErrno(syscall.EIO)) {
		t.Fatalf("writes until the tmpfs is full: %v after %d bytes; want EIO", failure, flushed)
	}
	st := s.status()
	if st.State != "failed" {
		t.Fatalf("after ENOSPC: array %q, missing %v; want failed (two members lost together)", st.State, st.Missing)
	}
	t.Logf("the array failed after %d flushed bytes: %s", flushed, failure)
	c.Close()
	s.crash() // the failed daemon is killed; what is on disk is what the failure left
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	forceBack(t, a, flags, data, piece)
}

// TestForceTogether: members 2 and 3 fail in one batch of member writes (1 MiB of them, run
// concurrently), neither failure recorded in the other's superblock — TestForceAfterENOSPC's
// race, made certain: faulty: specs fail their data and superblock writes once a control file
// exists, so whichever fails first cannot record it on the other. Both stopped at one events
// counter; offline status names both, serve refuses naming both, serve --force trusts both
// and rebuilds neither, and every flushed byte reads back, before and after the resync.
func TestForceTogether(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("raid5d only")
	}
	a := newArray(t)
	ctl := filepath.Join(a.dir, "faults-on")
	faulty := a
	for _, i := range []int{2, 3} {
		faulty = faulty.withSpec(i, "faulty:"+a.members[i]+"?ctl="+ctl+"&wfail=all&wfail=4K+4K") // the superblock
	}
	flags := []string{"--sync-speed-min", "200M", "--sync-speed-max", "1G"}
	s := faulty.serve(t, flags...)
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	const piece = 4 * stripeData
	data := make([]byte, 4*piece)
	for i := range data {
		data[i] = byte(i*29 + i/4093)
	}
	if err := c.writeAt(data, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	touch(t, ctl)
	if err := c.writeAt(bytes.Repeat([]byte{0xEE}, piece), uint64(len(data)), true); !errors.Is(err, nbdErrno(syscall.EIO)) {
		t.Fatalf("the write that fails members 2 and 3: %v; want EIO", err)
	}
	if st := s.status(); st.State != "failed" {
		t.Fatalf("after members 2 and 3 failed: array %q, missing %v; want failed", st.State, st.Missing)
	}
	c.Close()
	s.crash()
	if !forceBack(t, a, flags, data, piece) {
		t.Fatal("members 2 and 3 did not fail together")
	}
}

// forceBack brings back a's array, failed by two or more members and left as the failure left
// it, with serve --force (and flags), checking first that offline status and serve without
// --force say what it would do (and that the refusal writes nothing), then that every byte of
// data (flushed from offset 0, in pieces of piece bytes) reads back through NBD before and after
// the rebuild or resync and that scrub check finds nothing. It reports whether the stale
// members failed together (one events counter: all trusted, nothing rebuilt).
func forceBack(t *testing.T, a *array, flags []string, data []byte, piece int) (together bool) {
	t.Helper()
	flushed := len(data)
	// Which order the failures took decides what --force does: the stale members with the
	// lowest events counter failed first and are rebuilt, unless every stale member has that
	// counter (they failed together); the others stopped only with the array and are trusted.
	var trusted, rebuilt []string
	stale := offlineEvents(t, a.members, "stale")
	first := slices.Min(slices.Collect(maps.Values(stale)))
	together = !slices.ContainsFunc(slices.Collect(maps.Values(stale)), func(e uint64) bool { return e != first })
	for _, m := range a.members {
		if e, ok := stale[m]; ok && (together || e > first) {
			trusted = append(trusted, m)
		} else if ok {
			rebuilt = append(rebuilt, m)
		}
	}
	t.Logf("stale members (path: events) %v: failed together %v; --force should trust %v and rebuild %v", stale, together, trusted, rebuilt)
	if len(trusted) == 0 || len(stale) < 2 {
		t.Fatalf("stale members %v: want two or more, and one at least that stopped only with the array", stale)
	}

	// Offline status says the array failed and that serve --force can assemble it, trusting them.
	out, err := runToolErr(raid5dBin, append([]string{"status"}, a.members...)...)
	if err == nil || !strings.Contains(out, "failed") || !strings.Contains(out, "serve --force can assemble it") ||
		slices.ContainsFunc(trusted, func(m string) bool { return !strings.Contains(out, m+" stopped only") && !strings.Contains(out, m+",") }) {
		t.Errorf("offline status of the failed array: %v; want failed, naming serve --force and %v\n%s", err, trusted, out)
	}
	// Without --force: refused, saying what --force would do; nothing is written.
	var sums [][32]byte
	for _, m := range a.members {
		sums = append(sums, fileSum(t, m))
	}
	ctl := filepath.Join(a.dir, "refused.sock")
	out, err = runToolErr(raid5dBin, append([]string{"serve", "--socket", filepath.Join(a.dir, "refused-nbd.sock"), "--control", ctl}, a.members...)...)
	if err == nil || !strings.Contains(out, "--force") || !strings.Contains(out, "would trust") ||
		slices.ContainsFunc(append(trusted, rebuilt...), func(m string) bool { return !strings.Contains(out, m) }) {
		t.Fatalf("serve of the failed array without --force: %v; want a refusal naming --force and what it would do with %v and %v\n%s", err, trusted, rebuilt, out)
	}
	for i, m := range a.members {
		if fileSum(t, m) != sums[i] {
			t.Fatalf("the refused serve wrote %s", m)
		}
	}

	s := a.serve(t, append(flags, "--force")...)
	forced := regexp.MustCompile(`FORCED assembly[^\n]*"forced":"([^"]*)"`).FindStringSubmatch(s.out.String())
	if forced == nil || slices.ContainsFunc(a.members, func(m string) bool {
		return strings.Contains(forced[1], m+" (role") != slices.Contains(trusted, m)
	}) {
		t.Errorf("serve --force logged no forced assembly naming what it trusts (%v):\n%s", trusted, s.out.String())
	}
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	readBack := func(when string) {
		t.Helper()
		for off := 0; off < flushed; off += piece {
			got, err := c.readAt(uint64(off), uint32(piece))
			if err != nil {
				t.Fatalf("%s: read at %d: %v", when, off, err)
			}
			if i := firstDiff(got, data[off:off+piece]); i >= 0 {
				t.Fatalf("%s: flushed byte %d differs", when, off+i)
			}
		}
	}
	readBack("right after serve --force")
	waitFor(t, "the rebuild and resync after the forced assembly", 60*time.Second, s.proc, func() bool {
		cs := s.crashStatus()
		return s.status().healthy() && cs.Sync == nil && !cs.Unclean
	})
	readBack("after the rebuild and resync")
	if lr := s.status().LastRebuild; (lr != nil) != (len(rebuilt) > 0) {
		t.Errorf("after the forced assembly: last rebuild %+v; want one only if a member failed first (%v)", lr, rebuilt)
	}
	s.scrubClean()
	c.disconnect()
	return together
}

// offlineEvents returns the events counter of each member at paths whose state offline
// `raid5d status --json` reports as state, by path. The status may exit non-zero (a failed
// array); its JSON is on stdout.
func offlineEvents(t *testing.T, paths []string, state string) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	args := append([]string{"status", "--json", "--control", filepath.Join(t.TempDir(), "none.sock")}, paths...)
	out, err := exec.CommandContext(ctx, raid5dBin, args...).Output()
	var st struct {
		Source  string `json:"source"`
		Members []struct {
			Path   string `json:"path"`
			State  string `json:"state"`
			Events uint64 `json:"events"`
		} `json:"members"`
	}
	if jerr := json.Unmarshal(out, &st); jerr != nil || st.Source != "offline" {
		t.Fatalf("offline raid5d status --json: %v, %v, source %q\n%s", err, jerr, st.Source, out)
	}
	evs := map[string]uint64{}
	for _, m := range st.Members {
		if m.State == state {
			evs[m.Path] = m.Events
		}
	}
	return evs
}

// TestConfigAfterFailure (issue 13 item 11): a configuration file lists every member; one
// fails while serving. The same file still brings the array up, degraded without the member
// that missed writes, and the log says so; the data written since reads back.
func TestConfigAfterFailure(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("raid5d only")
	}
	a := newArray(t)
	var quoted []string
	for _, m := range a.members {
		quoted = append(quoted, strconv.Quote(m))
	}
	cfg := filepath.Join(a.dir, "array.toml")
	if err := os.WriteFile(cfg, []byte("members = ["+strings.Join(quoted, ", ")+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := &array{dir: a.dir} // no members on the command line: the file's
	s := fromFile.serve(t, "--config", cfg)
	s.mustManage("fail", "1")
	c, err := wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 8*stripeData)
	for i := range data {
		data[i] = byte(i*13 + i/511)
	}
	if err := c.writeAt(data, 0, true); err != nil {
		t.Fatal(err)
	}
	c.disconnect()
	c.Close()
	s.stop()

	s = fromFile.serve(t, "--config", cfg)
	st := s.status()
	if st.State != "degraded" || len(st.Missing) != 1 || st.Missing[0] != 1 {
		t.Fatalf("served from the file after member 1 failed: %q, missing %v; want degraded without role 1", st.State, st.Missing)
	}
	if state, _, _ := st.member(a.members[1]); state != "" {
		t.Errorf("the stale member is listed as %q; want it left out", state)
	}
	if log := s.out.String(); !strings.Contains(log, "left out") || !strings.Contains(log, a.members[1]) {
		t.Errorf("the log does not say that %s was left out:\n%s", a.members[1], log)
	}
	c, err = wireConnect(s.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.readAt(0, uint32(len(data)))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back degraded: %v, first difference at %d", err, firstDiff(got, data))
	}
	c.disconnect()
}
