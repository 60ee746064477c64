package nbdmember_test

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/client"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/member/nbdmember"
)

// TestReport: a member reports its export's name, the server's flags and block sizes, the
// requests in flight while the server holds them, and afterwards every request answered, the
// failed ones, their total time and the latency of the interval (its longest at least the
// time the server held a request); once its connection has broken, its link is down.
func TestReport(t *testing.T) {
	dev := nbdtest.NewMemDevice(1 << 20)
	hold := make(chan struct{})
	held := make(chan struct{}, 8)
	dev.Delay = func(op nbdtest.Op, off, n int64) {
		if off == 512<<10 {
			held <- struct{}{}
			<-hold
		}
	}
	dev.Fail = func(op nbdtest.Op, off, n int64) error {
		if off == 768<<10 {
			return syscall.EIO
		}
		return nil
	}
	sock := serve(t, nbd.Export{Name: "disk0", Device: nbdtest.FUADevice{MemDevice: dev}, MinBlock: 512, PreferredBlock: 4096, MaxBlock: 1 << 20})
	m := open(t, uri(sock, "disk0"), member.Exclusive, nbdmember.Options{})
	var _ member.Reporter = m

	r := m.Report()
	if r.Kind != "nbd" || r.State != member.LinkConnected || r.Server != "disk0" || r.ServerName != "disk0" || r.Conns != 1 {
		t.Errorf("report %+v, want kind nbd, connected, export disk0 (so named by the server), 1 connection", r)
	}
	// The default export: the URI asks for "", the server reports the name it stands for.
	if d := open(t, uri(sock, ""), member.Inspect, nbdmember.Options{}).Report(); d.Server != "" || d.ServerName != "disk0" {
		t.Errorf("default export: Server %q, ServerName %q; want \"\" and the server's NBD_INFO_NAME \"disk0\"", d.Server, d.ServerName)
	}
	for _, f := range []string{"flush", "fua", "trim", "write_zeroes"} {
		if !slices.Contains(r.Features, f) {
			t.Errorf("features %v: no %s", r.Features, f)
		}
	}
	if slices.Contains(r.Features, "read_only") || slices.Contains(r.Features, "has_flags") {
		t.Errorf("features %v: read_only or has_flags", r.Features)
	}
	if r.MinBlock != 512 || r.PreferredBlock != 4096 || r.MaxBlock != 1<<20 {
		t.Errorf("block sizes %d/%d/%d, want 512/4096/1M", r.MinBlock, r.PreferredBlock, r.MaxBlock)
	}

	p := make([]byte, 4096)
	for i := range 10 {
		if _, err := m.WriteAt(p, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.ReadAt(p, 768<<10); err == nil {
		t.Fatal("read of the failing range: no error")
	}
	const holdFor = 50 * time.Millisecond
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			q := make([]byte, 4096)
			_, err := m.ReadAt(q, 512<<10)
			errs <- err
		}()
	}
	<-held
	<-held
	if r := m.Report(); r.InFlight != 2 {
		t.Errorf("%d requests in flight while the server holds 2", r.InFlight)
	}
	time.Sleep(holdFor)
	close(hold)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r = m.Report()
	if r.InFlight != 0 || r.Requests != 13 || r.Errors != 1 || r.RequestTime < 2*holdFor {
		t.Errorf("after 13 requests, 1 failed, 2 held %v: in flight %d, requests %d, errors %d, time %v",
			holdFor, r.InFlight, r.Requests, r.Errors, r.RequestTime)
	}
	if l := r.Latency; l.Requests != 13 || l.Max < holdFor || l.Mean <= 0 || l.Mean > l.Max || l.Window <= 0 {
		t.Errorf("latency %+v, want 13 requests, a max of at least %v, 0 < mean <= max", l, holdFor)
	}

	m.Close() // the connection is gone: the next request fails
	if _, err := m.ReadAt(p, 0); !errors.Is(err, client.ErrDisconnected) {
		t.Fatalf("read after Close: %v, want ErrDisconnected", err)
	}
	if r := m.Report(); r.State != member.LinkDown || r.Conns != 0 {
		t.Errorf("after the connection broke: link %q, %d connections; want down, 0", r.State, r.Conns)
	}
}

// TestFlagNames: transmission flags decode by name in bit order, has_flags left out, unknown
// bits by value.
func TestFlagNames(t *testing.T) {
	got := nbdmember.FlagNames(client.FlagHasFlags | client.FlagSendFlush | client.FlagSendFUA | client.FlagCanMultiConn | 1<<15)
	if want := []string{"flush", "fua", "multi_conn", "0x8000"}; !slices.Equal(got, want) {
		t.Errorf("FlagNames = %v, want %v", got, want)
	}
	if got := nbdmember.FlagNames(client.FlagHasFlags); got == nil || len(got) != 0 {
		t.Errorf("FlagNames(has_flags) = %#v, want an empty list", got)
	}
}

// TestReportReconnect: while the server is gone and a request waits for a new connection,
// the link is reconnecting with no connection and the request in flight; once the server is
// back it is connected again with one reconnect counted; a connection broken with no request
// waiting is down.
func TestReportReconnect(t *testing.T) {
	dev := newCacheDevice(1 << 20)
	srv := newKillable(t, exportOf(t, the(dev)))
	m := open(t, uri(srv.path, "m"), member.Exclusive, nbdmember.Options{Timeout: 30 * time.Second, Logger: quiet})
	data := random(64 << 10)
	mustWrite(t, m, data, 0, "before the restart")
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	srv.kill()
	read := make(chan error, 1)
	go func() {
		got := make([]byte, len(data))
		_, err := m.ReadAt(got, 0)
		read <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for r := m.Report(); r.State != member.LinkReconnecting || r.Conns != 0 || r.InFlight != 1; r = m.Report() {
		if time.Now().After(deadline) {
			t.Fatalf("server gone, a read waiting: %+v, want reconnecting, no connection, 1 in flight", r)
		}
		time.Sleep(time.Millisecond)
	}
	srv.start()
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if r := m.Report(); r.State != member.LinkConnected || r.Conns != 1 || r.Reconnects != 1 || r.InFlight != 0 {
		t.Errorf("after the reconnect: %+v, want connected, 1 connection, 1 reconnect, none in flight", r)
	}
	srv.kill()
	for r := m.Report(); r.State != member.LinkDown; r = m.Report() {
		if time.Now().After(deadline) {
			t.Fatalf("server gone, no request: %+v, want down", r)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkReadAt4K is a 4 KiB READ over a unix socket to an in-memory export, counted by
// Report's stats, from 8 goroutines.
func BenchmarkReadAt4K(b *testing.B) {
	srv, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "m", Device: nbdtest.NewMemDevice(1 << 20)}}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	m, err := nbdmember.Open(uri(nbdtest.ServeUnix(b, srv), "m"), member.Exclusive, nbdmember.Options{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.SetBytes(4096)
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, 4096)
		for pb.Next() {
			if _, err := m.ReadAt(p, 0); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestReportConns: a member with several connections (Options.Conns, a server that
// advertises CAN_MULTI_CONN) reports them all, and multi_conn among the server's flags.
func TestReportConns(t *testing.T) {
	sock := serve(t, nbd.Export{Name: "m", Device: nbdtest.NewMemDevice(1 << 20)})
	m := open(t, uri(sock, "m"), member.Exclusive, nbdmember.Options{Conns: 3, Logger: quiet})
	trust(t, m)
	if r := m.Report(); r.Conns != 3 || r.State != member.LinkConnected || !slices.Contains(r.Features, "multi_conn") {
		t.Errorf("report %+v, want 3 connections, connected, multi_conn", r)
	}
}
