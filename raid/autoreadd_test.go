package raid_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/nbd/nbdtest"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
	"github.com/raid5d/raid5d/raid/member/nbdmember"
)

// The remote members' tests open nbd+unix:// specs as the daemon does, which registers them.
func init() {
	nbdmember.Register(func() nbdmember.Options {
		return nbdmember.Options{Timeout: 20 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	})
}

// exportHost is one member's host: an in-memory export served on a unix socket, which a test
// stops (the host is lost: its connections close, new ones are refused) and starts again with
// the same bytes, or with other ones.
type exportHost struct {
	t    *testing.T
	sock string
	dev  *nbdtest.MemDevice
	stop func() // stops the server and waits for it; nil when stopped
}

func (h *exportHost) uri() string { return "nbd+unix:///m?socket=" + h.sock }

// start serves h.dev on h.sock until stopped or the test ends.
func (h *exportHost) start() {
	h.t.Helper()
	srv, err := nbd.NewServer(nbd.Options{Exports: []nbd.Export{{Name: "m", Device: h.dev}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		h.t.Fatal(err)
	}
	os.Remove(h.sock)
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	h.stop = func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Serve: %v", err)
		}
		h.stop = nil
	}
}

// down stops h's server.
func (h *exportHost) down() {
	h.t.Helper()
	if h.stop != nil {
		h.stop()
	}
}

// exportHosts starts n export hosts of size bytes each, stopped when the test ends (after the
// array's cleanups, which run first).
func exportHosts(t *testing.T, n int, size int) []*exportHost {
	t.Helper()
	dir, err := os.MkdirTemp("", "r5a") // unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	var hs []*exportHost
	t.Cleanup(func() {
		for _, h := range hs {
			h.down()
		}
		os.RemoveAll(dir)
	})
	for i := range n {
		h := &exportHost{t: t, sock: filepath.Join(dir, string(rune('0'+i))+".sock"), dev: nbdtest.NewMemDevice(size)}
		h.start()
		hs = append(hs, h)
	}
	return hs
}

func hostURIs(hs []*exportHost) []string {
	var u []string
	for _, h := range hs {
		u = append(u, h.uri())
	}
	return u
}

// remoteChunks is the member data of the remote tests' arrays, in chunks: 256 stripes, 64
// write-intent regions of 4.
const remoteChunks = 256

// newRemoteArray creates an array over 4 exports as readdArray does over files (filled,
// flushed, every bit cleared, no stripe cache: reads reach the members).
func newRemoteArray(t *testing.T) (*raid.Array, []*exportHost, []byte) {
	t.Helper()
	size := raid.DataOffset + remoteChunks*testChunk
	hs := exportHosts(t, 4, int(size))
	a, err := raid.Create(hostURIs(hs), raid.CreateOptions{Chunk: testChunk, MemberSize: int64(size),
		BitmapRegion: 4 * 3 * testChunk, IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	raid.StopBitmapCleaner(a)
	model := writeModel(t, a, remoteChunks)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0)
	return a, hs, model
}

// remoteArray is newRemoteArray with AutoReAdd running on it until the test ends, probing
// every 20 ms at first (at most every 200 ms).
func remoteArray(t *testing.T) (*raid.Array, []*exportHost, []byte) {
	t.Helper()
	a, hs, model := newRemoteArray(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.AutoReAdd(ctx, raid.AutoReAddOptions{Specs: hostURIs(hs), Interval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done }) // before the array's Close (LIFO)
	waitStatus(t, a, "AutoReAdd running", func(st raid.Status) bool { return st.AutoReAdd != nil })
	return a, hs, model
}

// span is a range of the array a test writes.
type span struct{ off, n int64 }

// writeSpans writes random bytes from rng to each span of a, in order, the same into model,
// and flushes; before(i) runs before span i's write.
func writeSpans(t *testing.T, a *raid.Array, model []byte, rng *rand.Rand, spans []span, before func(i int)) {
	t.Helper()
	for i, w := range spans {
		before(i)
		p := model[w.off : w.off+w.n]
		fill(rng, p)
		if _, err := a.WriteAt(p, w.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
}

// loseAndWrite writes 5 regions' worth (one write crossing two regions), updating model:
// the first, a whole stripe, before member 1's host is lost with that write on it unflushed
// (so that the member cannot reconnect: nbdmember fails it with ErrLostWrites at once,
// rather than after a deadline spent redialing), the others after, while it is away.
func loseAndWrite(t *testing.T, a *raid.Array, hs []*exportHost, model []byte) {
	t.Helper()
	ss := a.Layout().StripeSize()
	region := 4 * ss
	writeSpans(t, a, model, newRand(5), []span{
		{63*region + 3*ss, ss},
		{2*region + 100, 300},
		{20*region + ss - 10, ss},
		{41*region - 5000, 9000}, // regions 40 and 41
	}, func(i int) {
		if i == 1 {
			hs[1].down()
		}
	})
	if s, _ := memberState(a.Status(), hs[1].uri()); s != raid.MemberFaulty {
		t.Fatalf("member 1 %q after its host was lost and the array written and flushed, want faulty", s)
	}
}

// TestAutoReAdd: a member whose host is lost (its server stopped) is failed by the writes
// that follow; when the host comes back, AutoReAdd re-adds the member by itself, resyncing
// only the regions written while it was away (the bytes resynced are those regions' chunks),
// and then every byte reads back with each other member failed in turn (each failed by
// request, which AutoReAdd leaves alone: each is re-added by hand).
func TestAutoReAdd(t *testing.T) {
	a, hs, model := remoteArray(t)
	loseAndWrite(t, a, hs, model)
	st := a.Status()
	if len(st.AutoReAdd) != 1 || st.AutoReAdd[0].Member != hs[1].uri() {
		// It may not have looked yet.
		st = waitStatus(t, a, "member 1 probed", func(st raid.Status) bool {
			return len(st.AutoReAdd) == 1 && st.AutoReAdd[0].Probes > 0
		})
	}
	if p := st.AutoReAdd[0]; p.Member != hs[1].uri() || p.Refused {
		t.Fatalf("probing %+v, want member 1, not refused", p)
	}
	if r := remoteOf(t, st, hs[1].uri()); r.State != member.LinkDown {
		t.Errorf("member 1's link %q while its host is lost, want %q", r.State, member.LinkDown)
	}

	hs[1].start()
	st = waitStatus(t, a, "member 1 re-added by itself and resynced", func(st raid.Status) bool {
		s, _ := memberState(st, hs[1].uri())
		return s == raid.MemberActive && st.Sync == nil && st.LastRebuild != nil
	})
	p := st.LastRebuild
	if want := int64(5 * 4 * testChunk); !p.ReAdd || p.Err != "" || p.Resynced != want || p.Done != p.Total {
		t.Fatalf("automatic re-add %+v, want a finished re-add that resynced %d bytes: the 5 regions' chunks only", p, want)
	}
	if r := remoteOf(t, st, hs[1].uri()); r.State != member.LinkConnected || r.Requests == 0 {
		t.Errorf("member 1 after the re-add: link %q, %d requests; want connected, some", r.State, r.Requests)
	}
	waitStatus(t, a, "member 1 no longer probed", func(st raid.Status) bool { return st.AutoReAdd != nil && len(st.AutoReAdd) == 0 })

	// A member failed by request stays failed: AutoReAdd does not probe it.
	if err := a.Fail(hs[2].uri()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // 20 looks at the array
	if st := a.Status(); len(st.AutoReAdd) != 0 {
		t.Fatalf("after member 2 was failed by request: probing %+v, want none", st.AutoReAdd)
	}
	if s, _ := memberState(a.Status(), hs[2].uri()); s != raid.MemberFaulty {
		t.Fatalf("member 2 %q, failed by request, want faulty", s)
	}
	reAdded(t, a, hs[2].uri())
	raid.CleanBitmap(a, 0)
	checkEachOut(t, a, hostURIs(hs), 1, model)
}

// TestReAddRemote: `re-add` by hand of a remote member that failed because its host was lost
// and then came back connects to it afresh (before, the array's broken connection was used,
// and the re-add refused: no superblock could be read), resyncing only the bitmap's regions.
func TestReAddRemote(t *testing.T) {
	a, hs, model := newRemoteArray(t)
	loseAndWrite(t, a, hs, model)
	hs[1].start()
	if p := reAdded(t, a, hs[1].uri()); p.Resynced != 5*4*testChunk {
		t.Fatalf("re-add resynced %d bytes, want the 5 regions' %d", p.Resynced, 5*4*testChunk)
	}
	raid.CleanBitmap(a, 0)
	checkEachOut(t, a, hostURIs(hs), 1, model)
}

// TestAutoReAddForeign: a member whose host comes back with another array's member on the
// export (a foreign superblock) is not re-added: AutoReAdd reports it refused
// (ErrForeignMember's text), probes it no more, writes nothing to it, and the array stays
// degraded, every byte still read back.
func TestAutoReAddForeign(t *testing.T) {
	a, hs, model := remoteArray(t)
	other := memberPaths(t.TempDir(), 4)
	o, err := raid.Create(other, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + remoteChunks*testChunk,
		BitmapRegion: 4 * 3 * testChunk})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	foreign, err := os.ReadFile(other[1])
	if err != nil {
		t.Fatal(err)
	}
	loseAndWrite(t, a, hs, model)
	hs[1].dev = nbdtest.NewMemDevice(len(foreign))
	if _, err := hs[1].dev.WriteAt(foreign, 0); err != nil {
		t.Fatal(err)
	}
	hs[1].start()
	st := waitStatus(t, a, "member 1 refused", func(st raid.Status) bool {
		return len(st.AutoReAdd) == 1 && st.AutoReAdd[0].Refused
	})
	p := st.AutoReAdd[0]
	if p.Member != hs[1].uri() || !errors.Is(p.Err, raid.ErrForeignMember) || !errors.Is(p.Err, raid.ErrCannotReAdd) {
		t.Fatalf("refused probe %+v, want member 1, ErrCannotReAdd and ErrForeignMember", p)
	}
	time.Sleep(400 * time.Millisecond) // 20 looks at the array
	st = a.Status()
	if len(st.AutoReAdd) != 1 || st.AutoReAdd[0].Probes != p.Probes || st.State != raid.StateDegraded || st.Sync != nil {
		t.Fatalf("after the refusal: state %v, sync %+v, probes %+v; want degraded, nothing running, no more probes of member 1",
			st.State, st.Sync, st.AutoReAdd)
	}
	if !bytes.Equal(hs[1].dev.Bytes(), foreign) {
		t.Fatal("the foreign member was written to")
	}
	got := make([]byte, len(model))
	if _, err := a.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("degraded read back: %v, equal %v", err, bytes.Equal(got, model))
	}
}

// remoteOf returns the Remote report of the member at path in st, failing the test if it has
// none.
func remoteOf(t *testing.T, st raid.Status, path string) *raid.MemberReport {
	t.Helper()
	i := slices.IndexFunc(st.Members, func(m raid.MemberStatus) bool { return m.Path == path })
	if i < 0 || st.Members[i].Remote == nil {
		t.Fatalf("no remote report for %s in %+v", path, st.Members)
	}
	return st.Members[i].Remote
}

// TestAutoReAddMissingAtAssembly: a remote member whose host is down when the array is
// assembled (missing: assembled degraded) and that comes back later is re-added by itself,
// found through AutoReAddOptions.Specs, resyncing only what was written while it was away.
func TestAutoReAddMissingAtAssembly(t *testing.T) {
	a, hs, model := newRemoteArray(t)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	hs[1].down()
	b, err := raid.Assemble(hostURIs(hs), raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	raid.StopBitmapCleaner(b)
	if st := b.Status(); st.State != raid.StateDegraded || !slices.Equal(st.Missing, []int{1}) {
		t.Fatalf("assembled without member 1's host: %v, missing %v; want degraded, [1]", st.State, st.Missing)
	}
	ss := b.Layout().StripeSize()
	writeSpans(t, b, model, newRand(9), []span{{7*4*ss + 5, 2 * ss}, {30 * 4 * ss, 100}}, func(int) {}) // regions 7, 30
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.AutoReAdd(ctx, raid.AutoReAddOptions{Specs: hostURIs(hs), Interval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitStatus(t, b, "member 1 probed", func(st raid.Status) bool {
		return len(st.AutoReAdd) == 1 && st.AutoReAdd[0].Member == hs[1].uri() && st.AutoReAdd[0].Probes > 0
	})
	hs[1].start()
	st := waitStatus(t, b, "member 1 re-added by itself", func(st raid.Status) bool {
		s, _ := memberState(st, hs[1].uri())
		return s == raid.MemberActive && st.Sync == nil && st.LastRebuild != nil
	})
	if p := st.LastRebuild; !p.ReAdd || p.Resynced != 2*4*testChunk {
		t.Fatalf("automatic re-add %+v, want a re-add of the 2 regions' chunks (%d bytes)", p, 2*4*testChunk)
	}
	raid.CleanBitmap(b, 0)
	checkEachOut(t, b, hostURIs(hs), 1, model)
}
