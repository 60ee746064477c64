package test

import "testing"

// fioJob is the part of one job's entry in fio's JSON output that the tests check.
type fioJob struct {
	Name  string `json:"jobname"`
	Error int    `json:"error"`
	Read  fioDir `json:"read"`
	Write fioDir `json:"write"`
	Sync  struct {
		TotalIOs int64 `json:"total_ios"`
	} `json:"sync"`
}

// fioDir is one direction (read or write) of a job in fio's JSON output.
type fioDir struct {
	IOBytes int64 `json:"io_bytes"`
	Lat     struct {
		Max float64 `json:"max"` // nanoseconds, submission to completion
	} `json:"lat_ns"`
}

// runFio runs the job file test/fio/<job> against uri (as NBD_URI) with extra command-line
// options, and returns the jobs from its JSON output. A non-zero exit, a job with an error, or
// output that does not parse fails the test.
func runFio(t *testing.T, uri, job string, extra ...string) []fioJob {
	t.Helper()
	return startFio(t, uri, job, extra...).wait()
}

// runFioIn is runFio with fio run under prefix (see prefixed): a client on a lab's host.
func runFioIn(t *testing.T, prefix []string, uri, job string, extra ...string) []fioJob {
	t.Helper()
	return startFioIn(t, prefix, uri, job, extra...).wait()
}

// checkVerifyJobs fails the test unless fio ran n jobs (as fio/verify.fio has 4 and
// fio/verify-second.fio 2) and each wrote its whole 16 MiB region and read all of it back for
// verification.
func checkVerifyJobs(t *testing.T, jobs []fioJob, n int) {
	t.Helper()
	const region = 16 << 20
	if len(jobs) != n {
		t.Fatalf("fio reported %d jobs, want %d", len(jobs), n)
	}
	for _, j := range jobs {
		if j.Write.IOBytes != region {
			t.Errorf("fio job %s wrote %d bytes, want %d", j.Name, j.Write.IOBytes, region)
		}
		if j.Read.IOBytes != region {
			t.Errorf("fio job %s verified %d bytes, want %d", j.Name, j.Read.IOBytes, region)
		}
	}
}

// TestFioVerify runs the verify jobs in each I/O mode the daemon offers: the default
// (write-back cache, stable pages: pinned buffers), stable pages with the immutable guard on (a
// stray write to a held buffer would crash the daemon), copying every write into the cache
// (--stable-pages=false), and every write written through (--stripe-cache off). Every mode
// reads through the members' mappings (--mapped-reads, the default): the verify pass's reads of
// 64 KiB and more must have been sent from them, and fio checks every byte and its offset.
func TestFioVerify(t *testing.T) {
	need(t, "fio")
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"default", nil},
		{"stable-pages", []string{"--stable-pages", "--debug-immutable"}},
		{"copy", []string{"--stable-pages=false"}},
		{"no-cache", []string{"--stripe-cache", "off"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if standin && mode.flags != nil {
				t.Skip("stand-in server has no such modes")
			}
			a := newArray(t)
			s := a.serve(t, mode.flags...)

			jobs := runFio(t, s.uri, "verify.fio")
			checkVerifyJobs(t, jobs, 4)
			for _, j := range jobs {
				// fsync=16: at least one flush per 16 writes went over the wire.
				if j.Sync.TotalIOs == 0 {
					t.Errorf("fio job %s issued no flushes", j.Name)
				}
			}

			// What was written is still there after a graceful restart.
			s.stop()
			s = a.serve(t, mode.flags...)
			checkVerifyJobs(t, runFio(t, s.uri, "verify.fio", "--verify_only"), 4)
			if !standin {
				s.stop()
				if c := stoppedCounters(t, s); c["mapped_bytes_read"] <= 0 {
					t.Errorf("no byte of the verify pass was sent from the members' mappings: %v", c)
				}
			}
		})
	}
}
