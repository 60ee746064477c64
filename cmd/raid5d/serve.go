package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
)

// The wiring: the array is what the NBD server exports.
var (
	_ nbd.Device    = (*raid.Array)(nil)
	_ nbd.FUAWriter = (*raid.Array)(nil)
)

const defaultListen = "127.0.0.1:10809"

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "[flags] MEMBER...",
		`Assembles the array from its MEMBERs (in any order; roles come from the superblocks) and serves
it over NBD until SIGINT or SIGTERM, which finish the requests in flight, flush the members, mark
the array clean and exit 0. With one member missing (a path that does not exist, or one left out),
the array is served degraded: every byte is still there, rebuilt from parity on the fly.`, stdout)
	listen := fs.String("listen", defaultListen, "TCP `address` to listen on (host:port)")
	socket := fs.String("socket", "", "listen on this unix socket `path` instead of TCP")
	export := fs.String("export", "raid5d", "export `name` (clients asking for the empty name get it too)")
	readOnly := fs.Bool("read-only", false, "serve read-only: writes, trims and zeroing get EPERM")
	logFormat := fs.String("log-format", "text", "log `format` on stderr: text or json")
	logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	members, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(members) == 0 {
		return fmt.Errorf("%w: no members given", errUsage)
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}

	a, err := raid.Assemble(members, raid.AssembleOptions{ReadOnly: *readOnly, Logger: log})
	if err != nil {
		return err
	}
	size, _ := a.Size()
	st := a.Status()
	log.Info("array assembled", "uuid", st.UUID, "state", st.State, "size", size,
		"members", a.Layout().Members(), "chunk", a.Layout().ChunkSize(), "layout", a.Layout().Algorithm().String())

	ln, addr, err := listenOn(*listen, *socket, log)
	if err != nil {
		a.Close()
		return err
	}
	srv, err := nbd.NewServer(nbd.Options{
		Exports: []nbd.Export{{
			Name:           *export,
			Description:    fmt.Sprintf("raid5d RAID-5 array %s", st.UUID),
			Device:         a,
			ReadOnly:       *readOnly,
			PreferredBlock: preferredBlock(a),
		}},
		Logger: log,
	})
	if err != nil {
		ln.Close()
		a.Close()
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("serving", "address", addr, "export", *export, "read_only", *readOnly, "attach", attachHint(*socket, *listen))
	serveErr := srv.Serve(ctx, ln)
	if *socket != "" {
		os.Remove(*socket)
	}
	closeErr := a.Close()
	if serveErr != nil && !errors.Is(serveErr, context.Canceled) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	if closeErr != nil {
		return fmt.Errorf("closing array: %w", closeErr)
	}
	log.Info("stopped: requests drained, members flushed, array marked clean")
	return nil
}

// preferredBlock is the array's full stripe when the protocol can carry it (a power of two up
// to the 32 MiB maximum), else 4096: clients that honour it then write whole stripes.
func preferredBlock(a *raid.Array) uint32 {
	s := a.Layout().StripeSize()
	if s&(s-1) == 0 && s <= 32<<20 {
		return uint32(s)
	}
	return 4096
}

func attachHint(socket, listen string) string {
	if socket != "" {
		return "nbd+unix:///?socket=" + socket
	}
	return "nbd://" + listen
}

func listenOn(addr, socket string, log *slog.Logger) (net.Listener, string, error) {
	if socket != "" {
		if err := removeStaleSocket(socket); err != nil {
			return nil, "", err
		}
		ln, err := net.Listen("unix", socket)
		if err != nil {
			return nil, "", err
		}
		return ln, socket, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("listening on a non-loopback address without TLS: anyone who can reach it can read and overwrite the whole array",
			"address", ln.Addr().String())
	}
	return ln, ln.Addr().String(), nil
}

// removeStaleSocket removes a unix socket left behind by a daemon that is gone, and refuses to
// touch one that something still answers on, or a path that is not a socket.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("--socket %s: exists and is not a socket", path)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("--socket %s: another server is listening there", path)
	}
	return os.Remove(path)
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", errUsage, level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w: --log-format %q: want text or json", errUsage, format)
}
