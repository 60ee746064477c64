package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

const defaultListen = "127.0.0.1:10809"

// defaultAssembleTimeout is --assemble-timeout's default (raid.AssembleOptions.WaitRemote):
// as long as mdadm's last-resort timer waits for the rest of an array before it starts it
// degraded, and as the member timeout's default, which a host that drops the connection
// attempts already cost. A flag of its own: the member timeout is how long clients wait on a
// member that hangs, lowered for a quick failover; this is how long a booting daemon waits
// for hosts that boot slower, raised for hosts that take minutes.
const defaultAssembleTimeout = 30 * time.Second

// maxInFlightLimit is the most --max-in-flight takes, as bench's --iodepth: each request in
// flight costs a connection a request struct and a slot of its work queue (its buffer is bounded
// apart, by nbd.DefaultMaxInFlightBytes), so the bound is there to catch a typo, not memory.
const maxInFlightLimit = 4096

// newServer is nbd.NewServer; a test replaces it to see the options serve builds.
var newServer = nbd.NewServer

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "[flags] MEMBER...",
		`Assembles the array from its MEMBERs (in any order; roles come from the superblocks) and serves
it over NBD until SIGINT or SIGTERM, which finish the requests in flight, flush the members, mark
the array clean and exit 0. A second SIGINT or SIGTERM while that drain runs (a member that hangs
can make it last for ever) exits at once with status 128+signal (130, 143) and an ERROR line,
without flushing or marking anything: the array is left dirty and resynced at the next start, as
after a crash; writes not yet flushed may be lost. With one member missing (a path that does not exist, or one left out),
the array is served degraded: every byte is still there, rebuilt from parity on the fly. A remote
member whose server does not answer yet is waited for first (--assemble-timeout). An array that
was not shut down cleanly is refused degraded, unless it has a write journal: the stripes being
written at the crash may have torn parity, and the missing member's chunks computed from it could
read wrong (the write hole); bring the member back, or give --force (or --read-only to look).

Writes go through a write-back stripe cache: a partial-stripe write is acknowledged once it is in
the cache and written out a few milliseconds later, so a stream of small sequential writes
becomes full-stripe writes that need no member reads. As NBD allows, writes acknowledged but not
yet flushed may be lost in a crash; FLUSH and FUA writes are durable when acknowledged.

Stable pages (--stable-pages, on by default): the server promises that a request buffer is never
changed while the array holds it, so whole-stripe writes compute parity and write members
straight from the request buffer, and partial writes keep a reference to it in the cache instead
of copying. It saves one memory copy of every byte written. It is always safe here, because the
NBD server owns its request buffers; --stable-pages=false copies every write into the cache
first, as Linux md does without skip_copy.

Mapped reads (--mapped-reads, on by default): a read of 64 KiB or more whose bytes are in the
page cache of healthy member files is written to the client straight from the members' files
mapped read-only into memory, one copy instead of two. Bytes not in the page cache, in stripes
the cache holds, or on missing members are read as usual, so read errors still fail the member
and are rebuilt from parity. The daemon's resident memory then counts the mapped page cache it
has read (shared file pages, not its own). Off over TLS.

Mapped writes (--mapped-writes, on by default): a WRITE of whole stripes whose payload has
already arrived (no TLS, no FUA) is read from the socket straight into the member files mapped
into memory, where all of its pages are resident, and its parity XORed there: one copy instead
of three. Durability is the same (FLUSH still fdatasyncs every member); degraded stripes,
journaled arrays and every other write take the ordinary path (pwrite).

Management: the daemon answers raid5d status, fail, remove, add, replace, scrub and rebuild on a
control socket (permission 0600, owner only). It refuses to start if another daemon answers
there, and removes a stale socket left by one that died.

Configuration file (--config FILE): TOML, one flat table whose keys are the names of these flags
(listen = "127.0.0.1:10809", stable-pages = false, max-connections = 64, allow-client = ["alice"])
plus members = ["m0.img", ...]. Relative paths in it (members, socket, control, journal, tls-*) are
relative to the file's directory. Flags on the command line win over the file, and MEMBERs on
the command line replace its members. An unknown key is an error naming the key and its line.
--print-config prints the effective settings in the same format and exits.

Service manager: with $NOTIFY_SOCKET set (systemd Type=notify) the daemon sends READY=1 once the
array is assembled and the listener accepts, STATUS= lines (export, address, array state,
rebuild or resync progress; before that, the remote members --assemble-timeout waits for), STOPPING=1 on SIGTERM or SIGINT, and WATCHDOG=1 every half
$WATCHDOG_USEC.

Testing aids, never for real data: a MEMBER may be faulty:PATH?key=value&... (fault injection:
failing or dropped reads and writes, delays; keys in raid/doc.go), and with the key volatile
the member keeps its writes in the daemon's memory until it is synced, so killing the daemon
is a power cut; volatile:PATH?key=value&... is short for faulty:PATH?volatile&key=value&....
The journal (--journal, or the path create recorded) may be such a spec too.

`+directHelp+controlHelp, stdout)
	listen := fs.String("listen", defaultListen, "TCP `address` to listen on (host:port)")
	socket := fs.String("socket", "", "listen on this unix socket `path` instead of TCP")
	cf := addControlFlags(fs, "export `name` (clients asking for the empty name get it too); also names the default control socket")
	export := cf.export
	readOnly := fs.Bool("read-only", false, "serve read-only: writes, trims and zeroing get EPERM")
	logFormat := fs.String("log-format", "text", "log `format` on stderr: text or json")
	logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	stablePages := fs.Bool("stable-pages", true, "zero-copy writes from pinned, immutable request buffers (see above); =false copies every write")
	mappedReads := fs.Bool("mapped-reads", true, "answer reads of 64 KiB and more from the members' page cache mapped into memory, without\n"+
		"copying it into a buffer first (not over TLS; see above)")
	mappedWrites := fs.Bool("mapped-writes", true, "read the whole stripes of writes straight from the socket into the member files mapped\n"+
		"into memory as their bytes arrive, where their pages are resident (placed writes; see above)")
	var cacheFlag cacheSizeFlag
	fs.Var(&cacheFlag, "stripe-cache", "stripe cache `size`: a number of stripes (256), a size in bytes with a unit (64M), or off\n"+
		"(write-through, no cache); memory used is stripes × members × chunk. Default: 64M worth of stripes, 16 to 256")
	writeBackDelay := fs.Duration("write-back-delay", 0, "how long a partial stripe waits in the cache for more writes (`duration`; default 5ms)")
	mlock := fs.Bool("mlock", false, "mlock the request buffers (needs RLIMIT_MEMLOCK or CAP_IPC_LOCK)")
	schedBatchOn := fs.Bool("sched-batch", true, "run the daemon's threads under SCHED_BATCH (those under the normal policy): a thread woken by a\n"+
		"message does not preempt the one running on its CPU, so messages queue up and are read and sent\n"+
		"in batches; =false keeps the normal policy (see \"Members on other hosts\")")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on http://`address`/metrics, a loopback address (e.g. 127.0.0.1:9100)")
	pprofAddr := fs.String("pprof", "", "serve Go's pprof profiles on this loopback `address` (e.g. 127.0.0.1:6060)")
	debugImmutable := fs.Bool("debug-immutable", false, "debugging: mprotect request buffers read-only while the array holds them\n"+
		"(with stable pages, the default); a stray write then crashes the daemon loudly. Slow")
	var syncMin, syncMax sizeFlag
	fs.Var(&syncMin, "sync-speed-min", "rebuild and scrub `rate` per second kept up even under client I/O (default 1M; raid5d rebuild changes it live)")
	fs.Var(&syncMax, "sync-speed-max", "rebuild and scrub `rate` per second when clients are idle (default 200M)")
	memberTimeout := fs.Duration("member-timeout", 0, "deadline of a member's I/O (`duration`): a member with writes under way and none completing for\n"+
		"this long is failed (the array goes on degraded), and so is one whose superblock update or sync takes longer;\n"+
		"a read slower than this counts as a read error once it returns (its data is still used; past\n"+
		"--read-error-limit the member is failed). Default 30s; negative: none")
	assembleTimeout := fs.Duration("assemble-timeout", defaultAssembleTimeout, "how long the start waits for remote members (nbd://...) whose servers do not answer yet\n"+
		"(`duration`), as after a power cut of the rack: each is tried again with a backoff until it answers or\n"+
		"this has passed, then counts as missing. Local members are never waited for. 0: no wait")
	readErrorLimit := fs.Int("read-error-limit", 0, "read errors after which a member is marked faulty (`count`, default 20)")
	tlsCert := fs.String("tls-cert", "", "TLS certificate `file` (PEM); with --tls-key turns on NBD STARTTLS")
	tlsKey := fs.String("tls-key", "", "TLS private key `file` (PEM)")
	tlsClientCA := fs.String("tls-client-ca", "", "CA certificates `file` (PEM): clients must present a certificate it signed (mutual TLS)")
	tlsMode := fs.String("tls", "", "`mode`: require (default with a certificate: every client must STARTTLS), on (TLS and\n"+
		"plaintext both admitted), off (ignore the certificate)")
	var allowClients stringList
	fs.Var(&allowClients, "allow-client", "admit only clients whose certificate `name` (CN or DNS name) is this; repeatable; needs --tls-client-ca")
	var allowUIDs intList
	fs.Var(&allowUIDs, "allow-uid", "on a unix socket, admit only peers with this user `id`; repeatable")
	maxConns := fs.Int("max-connections", nbd.DefaultMaxConnections, "connections served at once; more are closed at once (`n`)")
	maxInFlight := rangeFlag{n: nbd.DefaultMaxInFlightRequests, lo: 1, hi: maxInFlightLimit}
	fs.Var(&maxInFlight, "max-in-flight", "requests of one connection served at once (`n`, 1 to 4096); past it the connection's next\n"+
		"requests wait unread in its socket (a client queuing more over slow members waits)")
	handshakeTimeout := fs.Duration("handshake-timeout", nbd.DefaultHandshakeTimeout, "a client must finish the NBD handshake within this `duration`")
	idleTimeout := fs.Duration("idle-timeout", 0, "close a connection with nothing in flight after this `duration` without a request (0: never)")
	replyTimeout := fs.Duration("reply-timeout", nbd.DefaultReplyTimeout, "close a connection whose client stops reading: one reply write may block this long (`duration`)")
	payloadTimeout := fs.Duration("payload-timeout", nbd.DefaultPayloadTimeout, "close a connection whose WRITE payload has not all arrived this `duration` after it began\n"+
		"(a fixed bound, not reset as bytes come: 30s asks about 1 MiB/s of a 32 MiB write)")
	journal := fs.String("journal", "", "write journal `file` or device of an array made with create --consistency journal, when it\n"+
		"is no longer where the superblocks say (default: the path they record); may be a volatile: spec (testing).\n"+
		"Refused if it is a member's own file or device")
	skipCorruptJournal := fs.Bool("skip-corrupt-journal", false, "assemble an array whose write journal is refused as corrupt: replay none of it, discard it and\n"+
		"recompute all parity from the members' data (a full resync); flushed writes are kept. One-off: not a configuration key")
	autoReAdd := fs.Bool("auto-re-add", false, "re-add by itself a remote member (nbd://...) that failed or is missing once its server answers again\n"+
		"with this array's superblock, its role and events the write-intent bitmap can bridge: only the regions\n"+
		"written meanwhile are resynced; one that cannot be re-added is logged and left to you (see README)")
	autoReAddInterval := fs.Duration("auto-re-add-interval", raid.DefaultAutoReAddInterval, "--auto-re-add's first probe of an away member comes this `duration` after it left,\n"+
		"the next ones twice as long after each other, up to a minute")
	rebuildStale := fs.Bool("rebuild-stale", false, "a stale member (one that missed writes) becomes a spare and is rebuilt, instead of being left out")
	force := fs.Bool("force", false, "assemble a failed array from the members that stopped only when it failed (as mdadm --assemble\n"+
		"--force): the log says which it trusts; they get one events counter, the array is marked dirty and\n"+
		"resynced, stale members are rebuilt. Also assembles a dirty array with a member missing, which is refused\n"+
		"without it (the write hole: see README). With --read-only nothing is written. One-off: not a configuration key")
	configFile := fs.String("config", "", "read settings and members from this TOML `file` (see above); flags given here win")
	printCfg := fs.Bool("print-config", false, "print the effective settings as a configuration file and exit")
	setMemberOpts := serveMemberFlags(fs)
	setDirect := directFlag(fs)
	members, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	// Member paths are made absolute, so status shows them whole and management commands run
	// from any directory can name them; those from a configuration file are relative to it.
	for i, m := range members {
		if members[i], err = absMember(m); err != nil {
			return err
		}
	}
	if *journal != "" { // a path, or a volatile: or faulty: spec with its PATH made absolute
		if *journal, err = absMember(*journal); err != nil {
			return fmt.Errorf("--journal: %w", err)
		}
	}
	src := settingSource{}
	fs.Visit(func(f *flag.Flag) { src[f.Name] = "command line" })
	if *configFile != "" {
		fileMembers, fileSrc, err := applyConfigFile(*configFile, fs)
		if err != nil {
			return err
		}
		src = fileSrc
		if len(members) == 0 {
			members = fileMembers
		} else {
			delete(src, configMembersKey)
		}
	}
	if *printCfg {
		return printConfig(stdout, fs, members, src)
	}
	setDirect()
	if len(members) == 0 {
		return fmt.Errorf("%w: no members given", errUsage)
	}
	if syncMin.n > 0 && syncMax.n > 0 && syncMin.n > syncMax.n {
		return fmt.Errorf("%w: --sync-speed-min %s is above --sync-speed-max %s", errUsage, formatSize(syncMin.n), formatSize(syncMax.n))
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	setMemberOpts(*memberTimeout, log) // a remote member's requests have the array's member timeout
	if *schedBatchOn {
		if err := schedBatch(); err != nil {
			log.Warn("cannot run under SCHED_BATCH; serving under the normal policy", "err", err)
		}
	}

	if *pprofAddr != "" {
		if err := startPprof(*pprofAddr, log); err != nil {
			return err
		}
	}
	if *debugImmutable && !*stablePages {
		return fmt.Errorf("%w: --debug-immutable needs stable pages (drop --stable-pages=false)", errUsage)
	}
	journalPath := *journal
	// With a service manager (systemd Type=notify) watching, say what is going on until READY.
	sd, err := newNotifier(os.Getenv, os.Getpid())
	if err != nil {
		log.Warn("cannot notify the service manager", "err", err)
	}
	defer sd.Close()
	if err := sd.send(statusLine(assemblingStatus(len(members), *assembleTimeout, nil))); err != nil {
		log.Warn("sd_notify", "err", err)
	}
	// The control socket comes first: a second daemon for the same socket stops here, before it
	// touches the members. Listen sets the umask briefly: no other goroutine runs yet.
	ctlPath := cf.socket()
	ctlLn, err := control.Listen(ctlPath)
	if err != nil {
		return fmt.Errorf("--control %s: %w", ctlPath, err)
	}
	defer ctlLn.Close() // removes the socket
	cacheStripes, cacheBytes := cacheFlag.options()
	a, err := raid.Assemble(members, raid.AssembleOptions{
		ReadOnly:     *readOnly,
		Logger:       log,
		RebuildStale: *rebuildStale,
		Force:        *force,
		JournalPath:  journalPath,
		WaitRemote:   *assembleTimeout,
		Waiting: func(away []string) { // on the service manager's STATUS line, until READY
			if err := sd.send(statusLine(assemblingStatus(len(members), *assembleTimeout, away))); err != nil {
				log.Warn("sd_notify", "err", err)
			}
		},

		IOOptions: raid.IOOptions{
			StablePages:      *stablePages,
			MappedReads:      *mappedReads,
			MappedWrites:     *mappedWrites,
			StripeCache:      cacheStripes,
			StripeCacheBytes: cacheBytes,
			WriteBackDelay:   *writeBackDelay,
			MemberTimeout:    *memberTimeout,
			ReadErrorLimit:   *readErrorLimit,
			SyncSpeedMin:     syncMin.n,
			SyncSpeedMax:     syncMax.n,
		},
		SkipCorruptJournal: *skipCorruptJournal,
	})
	if err != nil {
		return err
	}
	size, _ := a.Size()
	st := a.Status()
	if st.ReadOnly && !*readOnly { // the array decided (a journaled array without its journal)
		*readOnly = true
	}
	log.Info("array assembled", "uuid", st.UUID, "state", st.State, "size", size,
		"members", a.Layout().Members(), "chunk", a.Layout().ChunkSize(), "layout", a.Layout().Algorithm().String())

	tlsConf, mode, err := serverTLS(*tlsCert, *tlsKey, *tlsClientCA, *tlsMode)
	if err != nil {
		a.Close()
		return err
	}
	var metricsLn net.Listener
	if *metricsAddr != "" {
		if metricsLn, err = listenMetrics(*metricsAddr); err != nil {
			a.Close()
			return err
		}
		defer metricsLn.Close() // in case serving never starts; closing twice is harmless
	}
	ln, addr, err := listenOn(*listen, *socket, mode != nbd.TLSOff && tlsConf != nil, log)
	if err != nil {
		a.Close()
		return err
	}
	var dev nbd.Device = arrayDevice{a}
	reqMetrics := newRequestMetrics()
	if metricsLn != nil {
		dev = instrumentDevice(dev, reqMetrics)
	}
	srv, err := newServer(nbd.Options{
		MlockBuffers:        *mlock,
		DebugImmutable:      *debugImmutable,
		TLSConfig:           tlsConf,
		TLSMode:             mode,
		MaxConnections:      *maxConns,
		MaxInFlightRequests: maxInFlight.n,
		HandshakeTimeout:    *handshakeTimeout,
		IdleTimeout:         *idleTimeout,
		ReplyTimeout:        *replyTimeout,
		PayloadTimeout:      *payloadTimeout,
		Exports: []nbd.Export{{
			StablePages:    *stablePages,
			MappedReads:    *mappedReads,
			Name:           *export,
			Description:    fmt.Sprintf("raid5d RAID-5 array %s", st.UUID),
			Device:         dev,
			ReadOnly:       *readOnly,
			PreferredBlock: preferredBlock(a),
			AllowedClients: allowClients,
			AllowedUIDs:    allowUIDs,
		}},
		Logger: log,
	})
	if err != nil {
		ln.Close()
		a.Close()
		return err
	}

	if metricsLn != nil {
		reg, err := newMetricsRegistry(newArrayCollector(a.Status, srv.BufferStats), reqMetrics)
		if err != nil {
			ln.Close()
			a.Close()
			return err
		}
		stopMetrics := serveMetrics(metricsLn, reg, log)
		defer stopMetrics()
	}

	ctx, stop := stopOnSignal(log) // a second signal exits at once, leaving the array dirty
	defer stop()
	ctlCtx, stopControl := context.WithCancel(ctx)
	waitControl := startControl(ctlCtx, controlServer(a, control.Daemon{
		PID: os.Getpid(), Version: versionString(), Export: *export, Address: attachHint(*socket, *listen), Started: time.Now(),
	}, log), ctlLn, log)
	var autoDone sync.WaitGroup
	autoCtx, stopAuto := context.WithCancel(ctx)
	defer stopAuto()
	if *autoReAdd {
		autoDone.Go(func() {
			a.AutoReAdd(autoCtx, raid.AutoReAddOptions{Specs: members, Interval: *autoReAddInterval})
		})
	}
	log.Info("serving", "address", addr, "export", *export, "read_only", *readOnly, "attach", attachHint(*socket, *listen),
		"control", ctlPath, "auto_re_add", *autoReAdd)
	// The listener accepts already (connections wait in its backlog until Serve takes them), so
	// READY=1 goes out now; STOPPING=1 when a signal arrives or Serve fails.
	notifyCtx, stopNotify := context.WithCancel(ctx)
	var notifyDone sync.WaitGroup
	notifyDone.Go(func() {
		sd.notifyLoop(notifyCtx, func() string { return serviceStatus(*export, addr, a.Status()) }, time.Second, log)
	})
	serveErr := srv.Serve(ctx, ln)
	stopNotify()
	notifyDone.Wait()
	stopControl()
	stopAuto()
	waitControl() // no management request runs once the array closes
	autoDone.Wait()
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
	c := a.Counters()
	log.Info(stoppedMessage(a.Status()),
		"full_stripe_writes", c.FullStripeWrites, "rmw_writes", c.RMWWrites, "rcw_writes", c.RCWWrites,
		"member_bytes_read", c.MemberBytesRead, "mapped_bytes_read", c.MappedBytesRead, "member_bytes_written", c.MemberBytesWritten,
		"mapped_bytes_written", c.MappedBytesWritten,
		"bytes_copied", c.CopiedBytes, "cache_hits", c.CacheHits, "cache_misses", c.CacheMisses,
		"cache_evictions", c.CacheEvictions, "direct_bounced", member.Bounced())
	return nil
}

// serviceStatus is the one-line STATUS= the service manager shows: what is served where, the
// array's state, and a rebuild, resync or scrub with its progress.
func serviceStatus(export, addr string, st raid.Status) string {
	s := fmt.Sprintf("serving %s on %s, state %s", export, addr, st.State)
	if p := st.Sync; p != nil && p.Total > 0 {
		s += fmt.Sprintf(", %s %d%%", p.Kind, p.Done*100/p.Total)
	}
	return s
}

// absMember makes a member or journal path absolute; in a faulty:PATH?... or volatile:PATH?...
// spec (testing aids, see the raid package) the PATH, keeping the rest.
func absMember(m string) (string, error) {
	return raid.MapSpecPath(m, filepath.Abs)
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

func listenOn(addr, socket string, withTLS bool, log *slog.Logger) (net.Listener, string, error) {
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
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() && !withTLS {
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

// cacheSizeFlag is --stripe-cache: a plain number is stripes, a number with a unit is bytes
// (turned into stripes once the geometry is known), "off" is no cache.
type cacheSizeFlag struct {
	set     bool
	off     bool
	stripes int
	bytes   int64
}

func (f *cacheSizeFlag) String() string {
	switch {
	case f == nil || !f.set:
		return ""
	case f.off:
		return "off"
	case f.bytes > 0:
		return formatSize(f.bytes)
	}
	return strconv.Itoa(f.stripes)
}

func (f *cacheSizeFlag) Set(s string) error {
	*f = cacheSizeFlag{set: true}
	s = strings.TrimSpace(s)
	if s == "off" || s == "none" {
		f.off = true
		return nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 {
			return fmt.Errorf("want a positive number of stripes, a size such as 64M, or off")
		}
		f.stripes = n
		return nil
	}
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("want a positive size")
	}
	f.bytes = n
	return nil
}

// options returns the raid.IOOptions.StripeCache and StripeCacheBytes values: 0 for the
// default, -1 for no cache, else stripes; or a byte size, which the array turns into stripes
// with its geometry (no read of the members before assembly, which waits for late remote
// members as a read here would not).
func (f *cacheSizeFlag) options() (stripes int, bytes int64) {
	switch {
	case !f.set:
		return 0, 0
	case f.off:
		return -1, 0
	}
	return f.stripes, f.bytes
}

// serverTLS builds the NBD server's TLS settings from the flags: no certificate means no TLS
// (and --tls on/require is a usage error); a certificate means TLS required unless --tls says
// otherwise.
func serverTLS(cert, key, clientCA, mode string) (*tls.Config, nbd.TLSMode, error) {
	m := nbd.TLSDefault
	if mode != "" {
		var err error
		if m, err = nbd.ParseTLSMode(mode); err != nil {
			return nil, 0, fmt.Errorf("%w: --tls: %v", errUsage, err)
		}
	}
	if cert == "" && key == "" {
		if clientCA != "" {
			return nil, 0, fmt.Errorf("%w: --tls-client-ca needs --tls-cert and --tls-key", errUsage)
		}
		if m == nbd.TLSOn || m == nbd.TLSRequire {
			return nil, 0, fmt.Errorf("%w: --tls %s needs --tls-cert and --tls-key", errUsage, mode)
		}
		return nil, nbd.TLSOff, nil
	}
	if cert == "" || key == "" {
		return nil, 0, fmt.Errorf("%w: --tls-cert and --tls-key go together", errUsage)
	}
	if m == nbd.TLSOff {
		return nil, nbd.TLSOff, nil
	}
	conf, err := nbd.LoadTLSConfig(cert, key, clientCA)
	if err != nil {
		return nil, 0, err
	}
	return conf, m, nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// intList is a repeatable integer flag.
type intList []int

func (l *intList) String() string {
	parts := make([]string, len(*l))
	for i, v := range *l {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < 0 {
		return fmt.Errorf("want a user id, got %q", s)
	}
	*l = append(*l, v)
	return nil
}
