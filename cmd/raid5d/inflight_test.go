package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// TestMaxInFlightServed: serve --max-in-flight N reaches the NBD server. serve assembles an
// array and builds its server's options; the test serves those options (over a device that
// holds every read until released) and sends N+16 reads at once on one connection: exactly
// N reach the device before any is answered, and never more. Without the flag: the default,
// 64. The server is not serve's own (that one runs until a signal), so serve ends with the
// test's error once the reads are checked.
func TestMaxInFlightServed(t *testing.T) {
	dir := t.TempDir()
	var ms []string
	for i := range 3 {
		ms = append(ms, filepath.Join(dir, fmt.Sprintf("m%d", i)))
	}
	if code, out, errOut := runCLI(t, append([]string{"create", "--size", "4M", "--chunk", "16K"}, ms...)...); code != 0 {
		t.Fatalf("create: %s%s", out, errOut)
	}
	ctlDir, err := os.MkdirTemp("", "r5if") // unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ctlDir) })
	t.Cleanup(func() { newServer = nbd.NewServer })
	errStop := errors.New("test: the reads are checked")
	for _, tc := range []struct {
		flags []string
		want  int
	}{
		{nil, nbd.DefaultMaxInFlightRequests},
		{[]string{"--max-in-flight", "5"}, 5},
		{[]string{"--max-in-flight", "1"}, 1},
		{[]string{"--max-in-flight", "200"}, 200},
	} {
		var got int
		newServer = func(opts nbd.Options) (*nbd.Server, error) {
			got = readsInFlight(t, opts, tc.want+16)
			return nil, errStop
		}
		args := append([]string{"serve", "--listen", "127.0.0.1:0", "--control", filepath.Join(ctlDir, "c.sock")}, tc.flags...)
		code, out, errOut := runCLI(t, append(args, ms...)...)
		if code != 1 || !strings.Contains(errOut, errStop.Error()) {
			t.Fatalf("serve %v: exit %d, want 1 with the test's error\n%s%s", tc.flags, code, out, errOut)
		}
		if got != tc.want {
			t.Errorf("serve %v: %d reads of %d sent at once reached the device, want %d", tc.flags, got, tc.want+16, tc.want)
		}
	}
}

// readsInFlight serves opts with its export's device replaced by one that holds every read,
// sends n 4 KiB reads at once on one connection, and returns how many reached the device
// before any was answered (once they stop coming for 100 ms); then it answers them all and
// checks that none more were ever in progress at once.
func readsInFlight(t *testing.T, opts nbd.Options, n int) int {
	t.Helper()
	mem := nbdtest.NewMemDevice(1 << 20)
	var entered atomic.Int64
	release := make(chan struct{})
	mem.Delay = func(op nbdtest.Op, off, length int64) {
		entered.Add(1)
		<-release
	}
	// serve's logger writes to runCLI's buffer, which serve's own return reads: this server
	// logs its connection's end after the test is done with it, so it logs nowhere.
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.Exports = []nbd.Export{opts.Exports[0]}
	opts.Exports[0].Device = mem
	srv, err := nbd.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	uri := fmt.Sprintf("nbd+unix:///%s?socket=%s", opts.Exports[0].Name, nbdtest.ServeUnix(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, uri, client.Options{MaxInFlight: n})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			p := make([]byte, 4096)
			if _, err := c.ReadAt(p, int64(i%256)*4096); err != nil {
				errs <- err
			}
		})
	}
	// Wait until the reads stop reaching the device: 100 ms without a new one.
	last, since := entered.Load(), time.Now()
	for time.Since(since) < 100*time.Millisecond {
		time.Sleep(5 * time.Millisecond)
		if e := entered.Load(); e != last {
			last, since = e, time.Now()
		}
		if ctx.Err() != nil {
			break
		}
	}
	held := int(entered.Load())
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("read: %v", err)
	}
	if st := mem.Stats(); st.MaxConcurrent > int64(held) || entered.Load() != int64(n) {
		t.Errorf("%d reads reached the device (want %d), at most %d at once, more than the %d held", entered.Load(), n, st.MaxConcurrent, held)
	}
	return held
}
