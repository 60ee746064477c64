package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/raid5d/raid5d/internal/looptest"
)

// directLoops attaches n loop devices with direct I/O on and 4 KiB logical blocks (losetup
// --direct-io=on --sector-size 4096: direct I/O on them must be 4 KiB-aligned) to sparse files
// of memberSize bytes in the test's temporary directory, detached by name when the test
// ends. Without root or loop devices it skips (fails with RAID5D_REQUIRE_TOOLS=1).
func directLoops(t *testing.T, n int) []string {
	t.Helper()
	need(t, "losetup")
	if os.Geteuid() != 0 {
		skipOrFail(t, "loop devices need root (euid %d)", os.Geteuid())
	}
	devs, err := looptest.AttachSparse(t, n, memberSize, looptest.Options{DirectIO: true, SectorSize: 4096})
	if err != nil {
		skipOrFail(t, "%v", err)
	}
	return devs
}

// statusDirect returns, by path, whether `raid5d status --json` says each member is open
// with O_DIRECT.
func statusDirect(s *server) map[string]bool {
	s.t.Helper()
	out, errOut, code := s.manageSplit("status", "--json")
	var st r5Remote
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("raid5d status --json: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	direct := map[string]bool{}
	for _, m := range st.Members {
		direct[m.Path] = m.Direct
	}
	return direct
}

// openedDirect reports, from /proc/PID/fdinfo, whether process pid has path open and whether
// every descriptor it has of it was opened with O_DIRECT.
func openedDirect(t *testing.T, pid int, path string) (open, direct bool) {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	direct = true
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || target != path {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(info)) {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				fl, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
				if err != nil {
					t.Fatalf("fdinfo flags %q: %v", v, err)
				}
				open = true
				direct = direct && fl&0o40000 != 0 // O_DIRECT on amd64 and 386
			}
		}
	}
	return open, open && direct
}

// TestDirectMembers serves arrays on block devices opened with O_DIRECT (loop devices with
// direct I/O, --direct auto: the default for block devices), with the write-intent bitmap and
// with a write journal (on a fifth direct device): writes of sizes from 1 byte to 2 MiB at odd
// offsets, FUA and FLUSH, a member failed and rebuilt onto a spare, a scrub, a crash (SIGKILL)
// and a restart from the rebuilt members — every byte read back and, with the daemon
// stopped, every stripe's parity checked on the devices. With --direct off the same devices
// are opened through the page cache.
func TestDirectMembers(t *testing.T) {
	if standin {
		t.Skip("raid5d members only")
	}
	for _, journal := range []bool{false, true} {
		t.Run(fmt.Sprintf("journal=%v", journal), func(t *testing.T) {
			devs := directLoops(t, 6)
			a := &array{dir: t.TempDir(), members: devs[:4]}
			spare, jdev := devs[4], devs[5]
			args := []string{"create", "--chunk", "64K", "--spare", spare}
			if journal {
				args = append(args, "--consistency", "journal", "--journal", jdev)
			}
			runTool(t, raid5dBin, append(args, a.members...)...)
			withSpare := &array{dir: a.dir, members: append(a.members[:4:4], spare)}
			s := withSpare.serve(t, "--sync-speed-min", "200M")
			shown := statusDirect(s)
			for _, dev := range append(a.members, spare) {
				if open, direct := openedDirect(t, s.cmd.Process.Pid, dev); !open || !direct {
					t.Fatalf("%s: open %v, O_DIRECT %v; want a direct member", dev, open, direct)
				}
				if !shown[dev] {
					t.Errorf("status --json: %s not direct (%v)", dev, shown)
				}
			}
			if journal {
				if _, direct := openedDirect(t, s.cmd.Process.Pid, jdev); !direct {
					t.Fatalf("journal %s is not open with O_DIRECT", jdev)
				}
			}
			c, err := wireConnect(s.sock)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { c.Close() }()
			model := make([]byte, arraySize)
			rng := rand.New(rand.NewPCG(17, uint64(len(args))))

			// 4 KiB-aligned requests (whole stripes, partial ones, FUA), a member failed and
			// rebuilt onto the spare, a scrub: every buffer that reaches a member is aligned,
			// none is bounced (the counter serve logs at exit).
			for i := range 40 {
				n := 4096 * (1 + rng.IntN(2*stripeData/4096))
				off := 4096 * rng.IntN((len(model)-n)/4096)
				writeModelAt(t, c, model, rng, off, n, i%10 == 9)
			}
			if err := c.flush(); err != nil {
				t.Fatal(err)
			}
			s.mustManage("fail", a.members[1])
			s.waitStatus("the rebuild onto the spare", 60*time.Second, func(st *r5Status) bool {
				return st.LastRebuild != nil && st.healthy()
			})
			readModel(t, c, model)
			s.scrubClean()
			c.Close()
			s.stop()
			if n := stoppedCounters(t, s)["direct_bounced"]; n != 0 {
				t.Fatalf("%v member calls of aligned requests, the rebuild and the scrub went through a bounce buffer", n)
			}

			// Sizes from 512 bytes to 2 MiB, each at an odd offset; every tenth with FUA.
			b := a.withRole(1, spare)
			s = b.serve(t, "--sync-speed-min", "200M")
			if c, err = wireConnect(s.sock); err != nil {
				t.Fatal(err)
			}
			i := 0
			for n := 1; n <= 2<<20; n = n*3/2 + 1 + rng.IntN(7) {
				writeModel(t, c, model, rng, n, i%10 == 9)
				i++
			}
			writeModel(t, c, model, rng, 2<<20, false)
			if err := c.flush(); err != nil {
				t.Fatal(err)
			}
			readModel(t, c, model)

			// Writes after the last flush are flushed by a FLUSH, then the daemon dies.
			for range 20 {
				writeModel(t, c, model, rng, 1+rng.IntN(3*stripeData), false)
			}
			if err := c.flush(); err != nil {
				t.Fatal(err)
			}
			c.Close()
			s.crash()
			s = b.serve(t, "--sync-speed-min", "200M")
			if journal {
				s.waitReplayed(0)
			} else {
				waitFor(t, "the resync after the restart", 60*time.Second, s.proc, func() bool {
					return s.crashStatus().Sync == nil
				})
				if r := s.crashStatus().LastResync; r != nil && (r.Err != "" || r.Done != r.Total) {
					t.Fatalf("resync after the crash: %+v", *r)
				}
			}
			if c, err = wireConnect(s.sock); err != nil {
				t.Fatal(err)
			}
			readModel(t, c, model)
			// Reads at odd multiples of 512 reach the members unaligned for their 4 KiB blocks
			// (writes do not: the stripe cache writes whole 4 KiB units): bounced.
			for range 50 {
				n := 512 * (1 + rng.IntN(4<<20/512))
				off := 512 * (rng.IntN((len(model)-n)/512-1) | 1)
				got, err := c.readAt(uint64(off), uint32(n))
				if err != nil {
					t.Fatalf("read of %d bytes at %d: %v", n, off, err)
				}
				if i := firstDiff(got, model[off:off+n]); i >= 0 {
					t.Fatalf("read of %d bytes at %d: byte %d differs from what was written", n, off, off+i)
				}
			}
			s.scrubClean()
			c.Close()
			s.stop()
			if n := stoppedCounters(t, s)["direct_bounced"]; n == 0 {
				t.Fatal("no member call of the reads at odd offsets went through a bounce buffer: the test shows nothing")
			}
			checkParity(t, b)

			// --direct off: the same devices through the page cache, the same bytes.
			s = b.serve(t, "--direct", "off")
			if _, direct := openedDirect(t, s.cmd.Process.Pid, b.members[0]); direct {
				t.Fatalf("--direct off: %s is open with O_DIRECT", b.members[0])
			}
			if shown := statusDirect(s); shown[b.members[0]] {
				t.Errorf("--direct off: status --json says %s is direct (%v)", b.members[0], shown)
			}
			if c, err = wireConnect(s.sock); err != nil {
				t.Fatal(err)
			}
			readModel(t, c, model)
			c.Close()
			s.stop()
		})
	}
}

// writeModel writes n random bytes (n rounded up to NBD's 512-byte minimum block) at a random
// odd multiple of 512 through c (with FUA if fua) and into model: no 4 KiB unit is written
// whole at either end, and on members of 4 KiB blocks no member call is aligned there.
func writeModel(t *testing.T, c *wireClient, model []byte, rng *rand.Rand, n int, fua bool) {
	t.Helper()
	n = (n + 511) / 512 * 512
	off := 512 * (rng.IntN((len(model)-n)/512-1) | 1)
	writeModelAt(t, c, model, rng, off, n, fua)
}

// writeModelAt writes n random bytes at off through c (with FUA if fua) and into model.
func writeModelAt(t *testing.T, c *wireClient, model []byte, rng *rand.Rand, off, n int, fua bool) {
	t.Helper()
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	if err := c.writeAt(p, uint64(off), fua); err != nil {
		t.Fatalf("write of %d bytes at %d: %v", n, off, err)
	}
	copy(model[off:], p)
}

// readModel reads the whole export through c and compares every byte (checkModel).
func readModel(t *testing.T, c *wireClient, model []byte) {
	t.Helper()
	if err := checkModel(c, model); err != nil {
		t.Fatal(err)
	}
}
