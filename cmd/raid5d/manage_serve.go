package main

import (
	"context"
	"errors"
	"log/slog"
	"net"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/raid"
)

// The control socket drives the array's management methods.
var _ control.Array = controlArray{}

// controlArray is the array as the control server drives it: its force flags are raid.Force.
type controlArray struct{ *raid.Array }

func forceOpt(force bool) []raid.ManageOption {
	if force {
		return []raid.ManageOption{raid.Force}
	}
	return nil
}

func (c controlArray) Fail(member string, force bool) error {
	return c.Array.Fail(member, forceOpt(force)...)
}

func (c controlArray) AddSpare(path string, force bool) error {
	return c.Array.AddSpare(path, forceOpt(force)...)
}

func (c controlArray) Replace(member, path string, force bool) error {
	return c.Array.Replace(member, path, forceOpt(force)...)
}

// controlServer is the daemon's management endpoint for array a.
func controlServer(a *raid.Array, d control.Daemon, log *slog.Logger) *control.Server {
	return &control.Server{
		Array:    controlArray{a},
		Status:   func() control.Status { return statusOf(a, d) },
		Classify: classify,
		Logger:   log,
	}
}

// classify maps the array's management errors to the control protocol's codes.
func classify(err error) error {
	for _, m := range []struct{ raid, control error }{
		{raid.ErrWouldFail, control.ErrWouldFail},
		{raid.ErrInUse, control.ErrInUse},
		{raid.ErrCannotReAdd, control.ErrCannotReAdd},
		{raid.ErrBusy, control.ErrBusy},
		{raid.ErrNoSuchMember, control.ErrNoSuchMember},
		{raid.ErrNotFaulty, control.ErrNotFaulty},
		{raid.ErrArrayFailed, control.ErrArrayFailed},
		{raid.ErrDegraded, control.ErrDegraded},
		{raid.ErrNotRunning, control.ErrNotRunning},
		{raid.ErrBadSpeed, control.ErrBadRequest},
	} {
		if errors.Is(err, m.raid) {
			return m.control
		}
	}
	return nil
}

// statusOf is the array's status in the control protocol's terms.
func statusOf(a *raid.Array, d control.Daemon) control.Status {
	s := a.Status()
	c := s.Counters
	st := control.Status{
		Daemon: d, UUID: s.UUID.String(), State: s.State.String(), Dirty: s.Dirty, Unclean: s.Unclean,
		Events: s.Events, Size: s.Size, Level: 5, Disks: s.Layout.Members(), Chunk: s.Layout.ChunkSize(),
		Layout: s.Layout.Algorithm().String(), Missing: s.Missing, Members: []control.MemberStatus{},
		Sync: progressOf(s.Sync), LastScrub: progressOf(s.LastScrub), LastResync: progressOf(s.LastResync),
		LastRebuild: progressOf(s.LastRebuild),
		WriteHole:   s.WriteHole, SuperblocksBusy: s.SuperblocksBusy, Consistency: s.Consistency,
		SyncSpeedMin: s.SyncSpeedMin, SyncSpeedMax: s.SyncSpeedMax,
		Counters: control.Counters{
			FullStripeWrites: c.FullStripeWrites, RMWWrites: c.RMWWrites, RCWWrites: c.RCWWrites,
			MemberBytesRead: c.MemberBytesRead, MappedBytesRead: c.MappedBytesRead, MemberBytesWritten: c.MemberBytesWritten, MappedBytesWritten: c.MappedBytesWritten, PlacedBytes: c.PlacedBytes, CopiedBytes: c.CopiedBytes,
			CacheHits: c.CacheHits, CacheMisses: c.CacheMisses, CacheEvictions: c.CacheEvictions,
			WriteThroughs: c.WriteThroughs, CacheStripes: c.CacheStripes,
		},
	}
	if b := s.Bitmap; b != nil {
		st.Bitmap = &control.Bitmap{RegionBytes: b.RegionBytes, Regions: b.Regions, Set: b.Set, Flushes: b.Flushes, Waits: b.Waits}
	}
	if j := s.Journal; j != nil {
		st.Journal = &control.Journal{Path: j.Path, Size: j.Size, Used: j.Used, Records: j.Records, Commits: j.Commits,
			Checkpoints: j.Checkpoints, FullWaits: j.FullWaits, Replayed: j.Replayed, Missing: j.Missing}
	}
	for _, m := range s.Members {
		st.Members = append(st.Members, control.MemberStatus{
			Path: m.Path, Role: m.Role, State: m.State, Events: m.Events, Device: m.Device.String(),
			ReadErrors: m.ReadErrors, WriteErrors: m.WriteErrors, Direct: m.Direct, Remote: remoteOf(m.Remote),
		})
	}
	if s.AutoReAdd != nil {
		st.AutoReAdd = &control.AutoReAdd{Members: []control.AutoReAddMember{}}
		for _, p := range s.AutoReAdd {
			m := control.AutoReAddMember{Member: p.Member, Probes: p.Probes, Refused: p.Refused}
			if p.Err != nil {
				m.Error = p.Err.Error()
			}
			if !p.Next.IsZero() {
				m.Next = &p.Next
			}
			st.AutoReAdd.Members = append(st.AutoReAdd.Members, m)
		}
	}
	return st
}

// remoteOf is a remote member's report in the control protocol's terms; nil for nil.
func remoteOf(r *raid.MemberReport) *control.Remote {
	if r == nil {
		return nil
	}
	l := r.Latency
	return &control.Remote{
		Kind: r.Kind, State: r.State, Export: r.Server, ServerName: r.ServerName, Flags: r.Features,
		MinBlock: r.MinBlock, PreferredBlock: r.PreferredBlock, MaxBlock: r.MaxBlock,
		Connections: r.Conns, Reconnects: r.Reconnects, InFlight: r.InFlight,
		Requests: r.Requests, Errors: r.Errors, RequestSeconds: r.RequestTime.Seconds(),
		Latency: control.Latency{WindowSeconds: l.Window.Seconds(), Requests: l.Requests,
			MeanSeconds: l.Mean.Seconds(), MaxSeconds: l.Max.Seconds()},
	}
}

func progressOf(p *raid.Progress) *control.Progress {
	if p == nil {
		return nil
	}
	return &control.Progress{
		Kind: p.Kind, Role: p.Role, Done: p.Done, Total: p.Total, BytesPerSec: p.BytesPerSec,
		ETASeconds: p.ETA.Seconds(), Mismatches: p.Mismatches, MismatchAt: p.MismatchAt,
		Resumed: p.Resumed, ReAdd: p.ReAdd, Resynced: p.Resynced, Err: p.Err,
	}
}

// startControl serves srv on ln until ctx is done. The returned wait blocks until every
// control request has been answered.
func startControl(ctx context.Context, srv *control.Server, ln *net.UnixListener, log *slog.Logger) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			log.Error("control socket failed; management requests are no longer answered", "error", err)
		}
	}()
	return func() { <-done }
}
