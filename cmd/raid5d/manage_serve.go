package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/raid"
)

// controlServer is the daemon's management endpoint for array a.
func controlServer(a *raid.Array, d control.Daemon, log *slog.Logger) *control.Server {
	mgmt, ok := any(a).(control.Array)
	if !ok {
		mgmt = unsupported{}
	}
	return &control.Server{
		Array:  mgmt,
		Status: func() control.Status { return statusOf(a, d) },
		Logger: log,
	}
}

// unsupported answers every management request with control.ErrUnsupported, for an array
// package without member management.
type unsupported struct{}

func (unsupported) err() error                     { return fmt.Errorf("%w: member management", control.ErrUnsupported) }
func (u unsupported) Fail(string) error            { return u.err() }
func (u unsupported) Remove(string) error          { return u.err() }
func (u unsupported) AddSpare(string) error        { return u.err() }
func (u unsupported) Replace(string, string) error { return u.err() }
func (u unsupported) StartScrub(bool) error        { return u.err() }
func (u unsupported) StopScrub() error             { return u.err() }
func (u unsupported) SetSyncSpeed(int64, int64) error {
	return u.err()
}

// statusOf is the array's status in the control protocol's terms.
func statusOf(a *raid.Array, d control.Daemon) control.Status {
	s := a.Status()
	c := a.Counters()
	st := control.Status{
		Daemon: d, UUID: s.UUID.String(), State: s.State.String(), Dirty: s.Dirty, Unclean: s.Unclean,
		Events: s.Events, Size: s.Size, Level: 5, Disks: s.Layout.Members(), Chunk: s.Layout.ChunkSize(),
		Layout: s.Layout.Algorithm().String(), Missing: s.Missing, Members: []control.MemberStatus{},
		Counters: control.Counters{
			FullStripeWrites: c.FullStripeWrites, RMWWrites: c.RMWWrites, RCWWrites: c.RCWWrites,
			MemberBytesRead: c.MemberBytesRead, MemberBytesWritten: c.MemberBytesWritten, CopiedBytes: c.CopiedBytes,
			CacheHits: c.CacheHits, CacheMisses: c.CacheMisses, CacheEvictions: c.CacheEvictions,
			WriteThroughs: c.WriteThroughs, CacheStripes: c.CacheStripes,
		},
	}
	for _, m := range s.Members {
		st.Members = append(st.Members, control.MemberStatus{
			Path: m.Path, Role: m.Role, State: m.State, Events: m.Events, Device: m.Device.String(),
		})
	}
	return st
}

// startControl serves srv on ln until ctx is done. The returned wait blocks until every
// control request has been answered and the socket is removed.
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
