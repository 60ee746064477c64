package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// crash SIGKILLs the server: no drain, no flush, no clean mark — a daemon crash.
func (s *server) crash() {
	s.t.Helper()
	s.stopped = true
	if !s.running() {
		s.t.Fatalf("server died before the crash: %v", s.err)
	}
	s.proc.stop(syscall.SIGKILL, stopGrace)
}

// TestCrashLoop kills the daemon with SIGKILL at random moments while raid5d bench writes with
// periodic flushes and logs what it wrote; after each restart, bench --check proves that every
// block flushed (or acknowledged after a flush) before the kill is intact and every other block
// holds one of the values written to it or its old contents. The same array lives through every
// crash, so later rounds also start from a dirty array.
func TestCrashLoop(t *testing.T) {
	needRaid5d(t)
	if standin {
		t.Skip("kills raid5d")
	}
	const rounds = 20
	rng := rand.New(rand.NewPCG(20261130, 1))
	a := newArray(t)
	dir := t.TempDir()
	s := a.serve(t)
	var durable int64
	for i := range rounds {
		log := filepath.Join(dir, fmt.Sprintf("round%02d.vlog", i))
		// Half the rounds mix block sizes across stripe boundaries; all flush every 16 writes
		// per job, two jobs on two connections.
		bs := "4K"
		if i%2 == 1 {
			bs = "36K"
		}
		bench := startProc(t, raid5dBin, "bench", s.uri, "--rw", "randwrite", "--bs", bs,
			"--iodepth", "8", "--jobs", "2", "--size", "24M", "--time", "30s",
			"--flush-every", "16", "--seed", fmt.Sprint(1000+i), "--verify-log", log)
		// Kill once the load is running (its log has grown past the baseline by a few
		// thousand records), at a random moment after that.
		var base int64 = -1
		waitFor(t, "bench to start writing", 20*time.Second, bench, func() bool {
			fi, err := os.Stat(log)
			if err != nil {
				return false
			}
			if base < 0 || fi.Size() < base+(16<<10) {
				if base < 0 && fi.Size() > 0 {
					base = fi.Size() // header and baseline CRCs are written before any write
				}
				return false
			}
			return true
		})
		time.Sleep(time.Duration(rng.IntN(600)) * time.Millisecond)
		s.crash()
		if _, err := bench.stop(syscall.SIGTERM, 20*time.Second); err == nil {
			t.Fatalf("round %d: bench exited 0 although the server was killed under it:\n%s", i, bench.out.String())
		}

		s = a.serve(t)
		out, err := runToolErr(raid5dBin, "bench", s.uri, "--check", log, "--json")
		var res struct {
			Blocks, Written, Durable, Violations int64
		}
		if jerr := json.Unmarshal([]byte(out), &res); jerr != nil || err != nil {
			t.Fatalf("round %d (bs %s): check after the crash: %v %v\n%s", i, bs, err, jerr, out)
		}
		if res.Violations != 0 || res.Durable == 0 || res.Written == 0 {
			t.Fatalf("round %d (bs %s): %d violations, %d blocks durable, %d written (want 0 violations and some durable):\n%s",
				i, bs, res.Violations, res.Durable, res.Written, out)
		}
		durable += res.Durable
	}
	s.stop()
	t.Logf("%d crashes, %d durable blocks checked intact", rounds, durable)
}
