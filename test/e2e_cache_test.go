package test

import (
	"bytes"
	"crypto/subtle"
	"os"
	"testing"
)

// counters returns the I/O counters from the daemon's last "stopped" log record (serve logs
// them at a graceful exit).
func stoppedCounters(t *testing.T, s *server) map[string]float64 {
	t.Helper()
	var last map[string]any
	for _, r := range logRecords(t, s.out.String(), 0) {
		if _, ok := r["full_stripe_writes"]; ok {
			last = r
		}
	}
	if last == nil {
		t.Fatalf("the daemon logged no counters at exit:\n%s", s.out.String())
	}
	c := map[string]float64{}
	for k, v := range last {
		if f, ok := v.(float64); ok {
			c[k] = f
		}
	}
	return c
}

// TestBatching: 4 KiB sequential writes through NBD (fio, iodepth 32) reach the members as
// full-stripe writes, one per stripe, without a single member read — in both cache modes. The
// daemon runs with a write-back delay of 2 s: with the default 5 ms, a client or daemon that the
// scheduler pauses for 5 ms in the middle of a stripe (routine on a loaded machine) has that
// stripe written out partly, by design, which reads the rest of it; a bound on the bytes read
// then measured the machine's load, not the cache. With a delay no scheduling gap reaches, any
// member read, read-modify-write or reconstruct-write, or a stripe written out twice, is the
// cache's doing, so the counts are exact.
func TestBatching(t *testing.T) {
	need(t, "fio")
	if standin {
		t.Skip("raid5d's counters only")
	}
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"copy", []string{"--stable-pages=false"}},
		{"stable-pages", nil},
	} {
		t.Run(mode.name, func(t *testing.T) {
			a := newArray(t)
			s := a.serve(t, append(mode.flags, "--write-back-delay", "2s")...)
			jobs := runFio(t, s.uri, "seq4k.fio")
			var written int64
			for _, j := range jobs {
				if j.Error != 0 {
					t.Fatalf("fio job %s: error %d", j.Name, j.Error)
				}
				written += j.Write.IOBytes
			}
			if written != 48<<20 {
				t.Fatalf("fio wrote %d bytes, want %d", written, 48<<20)
			}
			s.stop()
			c := stoppedCounters(t, s)
			stripes := float64(written) / stripeData
			t.Logf("%s: %v full-stripe writes of %.0f stripes, %v RMW, %v RCW, member bytes read %v, copied %v",
				mode.name, c["full_stripe_writes"], stripes, c["rmw_writes"], c["rcw_writes"], c["member_bytes_read"], c["bytes_copied"])
			if c["full_stripe_writes"] != stripes || c["rmw_writes"] != 0 || c["rcw_writes"] != 0 {
				t.Errorf("%v full-stripe writes, %v RMW, %v RCW for %.0f stripes written: want one full-stripe write per stripe and nothing else",
					c["full_stripe_writes"], c["rmw_writes"], c["rcw_writes"], stripes)
			}
			if read := c["member_bytes_read"]; read != 0 {
				t.Errorf("members read %v bytes for %d written sequentially in whole stripes, want 0", read, written)
			}
			switch {
			case mode.name == "stable-pages" && c["bytes_copied"] != 0:
				t.Errorf("stable pages copied %v bytes into the cache, want 0 for 4 KiB-aligned writes", c["bytes_copied"])
			case mode.name == "copy" && c["bytes_copied"] < float64(written):
				t.Errorf("--stable-pages=false copied %v bytes into the cache, want every byte written (%d)", c["bytes_copied"], written)
			}
		})
	}
}

// checkParity reads the member files directly and checks that, in every stripe, the XOR of all
// members' chunks is zero (P equals the XOR of the data, wherever P sits). The daemon must be stopped.
func checkParity(t *testing.T, a *array) {
	t.Helper()
	files := make([]*os.File, len(a.members))
	for i, p := range a.members {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	acc := make([]byte, chunkSize)
	buf := make([]byte, chunkSize)
	stripes := int64((memberSize - dataOffset) / chunkSize)
	bad := 0
	for s := int64(0); s < stripes; s++ {
		clear(acc)
		for _, f := range files {
			if _, err := f.ReadAt(buf, dataOffset+s*chunkSize); err != nil {
				t.Fatalf("reading stripe %d: %v", s, err)
			}
			subtle.XORBytes(acc, acc, buf)
		}
		if !bytes.Equal(acc, make([]byte, chunkSize)) {
			if bad < 5 {
				t.Errorf("stripe %d: parity does not match its data", s)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d stripes inconsistent", bad, stripes)
	}
}

// TestOverlappingWrites: six connections write overlapping random ranges at once, with stable
// pages and the immutable guard on (a stray write to a held buffer would crash the daemon);
// afterwards every stripe's parity matches its data, and a verify pass reads back every byte.
func TestOverlappingWrites(t *testing.T) {
	need(t, "fio")
	if standin {
		t.Skip("reads raid5d's member files")
	}
	a := newArray(t)
	s := a.serve(t, "--stable-pages", "--debug-immutable")
	for _, j := range runFio(t, s.uri, "overlap.fio") {
		if j.Error != 0 || j.Write.IOBytes == 0 {
			t.Fatalf("fio job %s: error %d, wrote %d bytes", j.Name, j.Error, j.Write.IOBytes)
		}
	}
	s.stop()
	checkParity(t, a)

	s = a.serve(t, "--stable-pages", "--debug-immutable")
	checkVerifyJobs(t, runFio(t, s.uri, "verify.fio"), 4)
	s.stop()
	checkParity(t, a)
}
