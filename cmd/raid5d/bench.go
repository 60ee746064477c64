package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/loadgen"
	"github.com/raid5d/raid5d/nbd/client"
)

const benchDescription = `Drives an NBD export (any server: raid5d, nbdkit, qemu-nbd, nbd-server) with a load and reports
throughput, IOPS, latency percentiles and the CPU the generator itself used. URI is
nbd://host[:port][/export] or nbd+unix:///export?socket=PATH; nbds:// and nbds+unix:// upgrade
the connection to TLS (NBD_OPT_STARTTLS): --tls-ca names the CA that signed the server's
certificate (default: the system's), --tls-cert and --tls-key a client certificate for a server
that requires one. The server's certificate must name the URI's host (localhost for a unix
socket) unless --tls-server-name says otherwise.

Writes DESTROY the data in the region. Every write carries incompressible data from a pool
filled once at start (PCG); each 4 KiB unit (or each block, below 4 KiB) gets a 32-byte
header: magic, generation, device offset, seed, job, and a CRC-32C over the whole unit. So the
generator costs little and every byte can be proven later.

--jobs opens that many connections; --iodepth keeps that many requests in flight on each. The
sequential modes split the region between jobs; the random ones share it. rw is random, half
reads and half writes.

--verify checks every unit read: a block written in this run must hold the generation last
written to it, with this seed; any other must be zeroes or a valid block of some run at the
right offset. A writing run with --verify then reads the whole region back. With --verify or
--verify-log each block has at most one request in flight, so every check is exact.

--verify-log FILE first reads the region (recording a CRC per unit), then logs every write
before it is sent, every acknowledgement, and every FLUSH (fsync'ing the log after each). After
a crash, 'raid5d bench URI --check FILE' reads the region back and proves that every block
holds what the log allows: a block with a durable write (acknowledged with FUA, or before an
acknowledged FLUSH) holds that generation or a later one; any other written block holds some
generation written to it or its old contents; an unwritten block holds its old contents. Use a
fresh --seed per run (the default is random). Exit status 1 on any violation.

Exit status: 0 success, 1 an I/O error, a verify mismatch or a check violation, 2 usage.`

func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "URI [flags]\n       raid5d bench URI --check FILE", benchDescription, stdout)
	rw := fs.String("rw", "read", "I/O `pattern`: read, write, randread, randwrite or rw (random, half reads, half writes)")
	bs := &sizeFlag{4096}
	fs.Var(bs, "bs", "block `size` of each I/O: a multiple of 512, of 4K above 4K")
	iodepth := fs.Int("iodepth", 32, "requests in flight per job (`n`)")
	jobs := fs.Int("jobs", 1, "jobs: `n` connections, each with its own iodepth")
	dur := fs.Duration("time", 30*time.Second, "run `duration`; 0 means one pass over the region")
	size := &sizeFlag{}
	fs.Var(size, "size", "region `size` (default: from --offset to the end of the export)")
	offset := &sizeFlag{}
	fs.Var(offset, "offset", "region start `offset` (a multiple of 4K, or of --bs below 4K)")
	verify := fs.Bool("verify", false, "check every block read (and read back what was written)")
	flushEvery := fs.Int("flush-every", 0, "send a FLUSH after every `n` writes of a job (0: never)")
	fua := fs.Bool("fua", false, "write with FUA (each write durable when acknowledged)")
	seed := fs.Uint64("seed", 0, "`seed` of data and offsets, written in every block (default: random)")
	verifyLog := fs.String("verify-log", "", "record writes, acknowledgements and flushes in `file` for --check")
	check := fs.String("check", "", "check the export against the verify log `file` instead of running a load")
	asJSON := fs.Bool("json", false, "print the summary as JSON on stdout")
	tf := addClientTLSFlags(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: want exactly one URI, got %d arguments", errUsage, len(pos))
	}
	uri := pos[0]
	dialOpts, err := tf.options(uri)
	if err != nil {
		return err
	}
	dialOpts.MaxInFlight = *iodepth
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if *check != "" {
		return runCheck(ctx, uri, *check, dialOpts, *asJSON, stdout)
	}
	mode, err := loadgen.ParseMode(*rw)
	if err != nil {
		return fmt.Errorf("%w: --rw: %v", errUsage, err)
	}
	if *jobs < 1 || *jobs > 1024 || *iodepth < 1 || *iodepth > 4096 || *flushEvery < 0 || *dur < 0 {
		return fmt.Errorf("%w: --jobs 1..1024, --iodepth 1..4096, --flush-every and --time not negative", errUsage)
	}
	if bs.n > 32<<20 {
		return fmt.Errorf("%w: --bs %s: at most 32M", errUsage, bs)
	}
	if *seed == 0 {
		*seed = rand.Uint64()
	}

	devs := make([]loadgen.Device, 0, *jobs)
	var conns []*client.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range *jobs {
		c, err := benchDial(ctx, uri, dialOpts)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		devs = append(devs, c)
	}
	c0 := conns[0]
	devSize, _ := c0.Size()
	if c0.Flags()&client.FlagReadOnly != 0 && (mode != loadgen.Read && mode != loadgen.RandRead) {
		return fmt.Errorf("%s is read-only; only --rw read and randread can run", uri)
	}
	if _, _, maxBlock := c0.BlockSize(); bs.n > int64(maxBlock) {
		return fmt.Errorf("%w: --bs %s is above the server's maximum block size %d", errUsage, bs, maxBlock)
	}
	if *fua && c0.Flags()&client.FlagSendFUA == 0 {
		return fmt.Errorf("%s does not support FUA", uri)
	}
	if (*flushEvery > 0 || *verifyLog != "") && c0.Flags()&client.FlagSendFlush == 0 && !*fua {
		return fmt.Errorf("%s does not support FLUSH", uri)
	}
	cfg := loadgen.Config{
		Mode: mode, BlockSize: int(bs.n), IODepth: *iodepth, Time: *dur,
		Offset: offset.n, Size: size.n, DeviceSize: devSize,
		Verify: *verify, FlushEvery: *flushEvery, FUA: *fua, Seed: *seed,
		VerifyLog: *verifyLog, MultiConn: c0.Flags()&client.FlagCanMultiConn != 0, Target: uri,
	}
	if isTerminal(stderr) {
		var last loadgen.Progress
		cfg.Progress = func(p loadgen.Progress) {
			dt := (p.Elapsed - last.Elapsed).Seconds()
			fmt.Fprintf(stderr, "\r\033[K%6.0fs  %9.1f MB/s  %9.0f IOPS", p.Elapsed.Seconds(),
				float64(p.Bytes-last.Bytes)/dt/1e6, float64(p.IOs-last.IOs)/dt)
			last = p
		}
	}
	res, err := loadgen.Run(ctx, cfg, devs)
	if cfg.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if errors.Is(err, loadgen.ErrConfig) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if res != nil {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(res); jerr != nil {
				return jerr
			}
		} else {
			printResult(stdout, res)
		}
	}
	return err
}

func runCheck(ctx context.Context, uri, path string, opts client.Options, asJSON bool, stdout io.Writer) error {
	iodepth := opts.MaxInFlight
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	st, err := loadgen.ReadLog(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	c, err := benchDial(ctx, uri, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	if size, _ := c.Size(); st.Header.Offset+st.Header.Size > size {
		return fmt.Errorf("%s: the log covers %d bytes at %d, but the export has %d", path, st.Header.Size, st.Header.Offset, size)
	}
	t := time.Now()
	res, err := loadgen.Check(ctx, c, st, iodepth, 10)
	if res != nil {
		if asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			enc.Encode(res)
		} else {
			fmt.Fprintf(stdout, "check %s against %s (seed %#x, %d log records) in %.1fs:\n", uri, path, st.Header.Seed, res.Records, time.Since(t).Seconds())
			fmt.Fprintf(stdout, "  blocks checked %d (%d units of %d bytes), written %d, durable %d\n", res.Blocks, res.Units, st.Header.Unit, res.Written, res.Durable)
			fmt.Fprintf(stdout, "  units unchanged %d, at the last generation sent %d\n", res.Unchanged, res.Latest)
			fmt.Fprintf(stdout, "  violations %d\n", res.Violations)
			for _, m := range res.First {
				fmt.Fprintf(stdout, "    %v\n", m)
			}
			if st.TornBytes > 0 {
				fmt.Fprintf(stdout, "  (ignored a torn last log record of %d bytes)\n", st.TornBytes)
			}
		}
	}
	return err
}

// clientTLSFlags are bench's --tls-ca, --tls-cert, --tls-key and --tls-server-name.
type clientTLSFlags struct {
	ca, cert, key, serverName *string
}

func addClientTLSFlags(fs *flag.FlagSet) clientTLSFlags {
	return clientTLSFlags{
		ca:         fs.String("tls-ca", "", "CA certificates `file` (PEM) that signed the server's certificate, for nbds:// URIs (default: the system's)"),
		cert:       fs.String("tls-cert", "", "client certificate `file` (PEM), for a server that requires one (serve --tls-client-ca)"),
		key:        fs.String("tls-key", "", "client private key `file` (PEM)"),
		serverName: fs.String("tls-server-name", "", "`name` the server's certificate must carry (default: the URI's host, localhost for a socket)"),
	}
}

// options checks uri and returns the client options the TLS flags ask for: a TLS configuration
// for an nbds URI, none for a plaintext one (where a TLS flag is a usage error).
func (f clientTLSFlags) options(uri string) (client.Options, error) {
	u, err := client.ParseURI(uri)
	if err != nil {
		return client.Options{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	given := *f.ca != "" || *f.cert != "" || *f.key != "" || *f.serverName != ""
	if !u.TLS {
		if given {
			return client.Options{}, fmt.Errorf("%w: --tls-ca, --tls-cert, --tls-key and --tls-server-name need an nbds:// or nbds+unix:// URI", errUsage)
		}
		return client.Options{}, nil
	}
	conf, err := client.LoadTLSConfig(*f.ca, *f.cert, *f.key, *f.serverName)
	if err != nil {
		return client.Options{}, err
	}
	return client.Options{TLSConfig: conf}, nil
}

// benchDial connects to uri within 30 seconds, saying how to fix it when the server requires
// TLS and the URI has none.
func benchDial(ctx context.Context, uri string, opts client.Options) (*client.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.Dial(dctx, uri, opts)
	if errors.Is(err, client.ErrTLSRequired) {
		return nil, fmt.Errorf("%s: server requires TLS; use nbds:// (or nbds+unix://) and --tls-ca: %w", uri, err)
	}
	return c, err
}

func printResult(w io.Writer, r *loadgen.Result) {
	fmt.Fprintf(w, "%s bs=%s iodepth=%d jobs=%d region=%s at %d, seed %#x: %.2fs\n",
		r.Mode, formatSize(int64(r.BlockSize)), r.IODepth, r.Jobs, formatSize(r.Size), r.Offset, r.Seed, r.Elapsed.Seconds())
	secs := max(r.Elapsed.Seconds(), 1e-9)
	if r.ReadIOs > 0 {
		fmt.Fprintf(w, "  read:  %9.1f MB/s %9.0f IOPS  (%d I/Os, %s)\n", float64(r.ReadBytes)/secs/1e6, float64(r.ReadIOs)/secs, r.ReadIOs, humanBytes(r.ReadBytes))
		printLat(w, "read", r.ReadLat)
	}
	if r.WriteIOs > 0 {
		fmt.Fprintf(w, "  write: %9.1f MB/s %9.0f IOPS  (%d I/Os, %s)\n", float64(r.WriteBytes)/secs/1e6, float64(r.WriteIOs)/secs, r.WriteIOs, humanBytes(r.WriteBytes))
		printLat(w, "write", r.WriteLat)
	}
	if r.ReadIOs > 0 && r.WriteIOs > 0 {
		fmt.Fprintf(w, "  total: %9.1f MB/s %9.0f IOPS\n", r.MBps, r.IOPS)
	}
	if r.Flushes > 0 {
		fmt.Fprintf(w, "  flushes: %d\n", r.Flushes)
		printLat(w, "flush", r.FlushLat)
	}
	fmt.Fprintf(w, "  cpu (this process): user %.2fs sys %.2fs = %.3f CPU s per GB moved\n",
		r.CPUUser.Seconds(), r.CPUSys.Seconds(), r.CPUSecPerGB)
	fmt.Fprintf(w, "  errors: %d", r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(w, " (first: %s)", r.FirstError)
	}
	fmt.Fprintln(w)
	if v := r.Verify; v != nil {
		fmt.Fprintf(w, "  verify: %d units checked: %d as written this run, %d zero, %d from an earlier run; %d mismatches",
			v.Units, v.Written, v.Zero, v.Previous, v.Mismatches)
		if v.ReadbackElapsed > 0 {
			fmt.Fprintf(w, " (read-back %.2fs)", v.ReadbackElapsed.Seconds())
		}
		fmt.Fprintln(w)
		for _, m := range v.First {
			fmt.Fprintf(w, "    %v\n", m)
		}
	}
	if r.VerifyLog != "" {
		fmt.Fprintf(w, "  verify log: %s\n", r.VerifyLog)
	}
}

func printLat(w io.Writer, name string, l loadgen.Latency) {
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Fprintf(w, "    %s lat (µs): p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  mean %.1f\n",
		name, us(l.P50), us(l.P90), us(l.P99), us(l.P999), us(l.Max), us(l.Mean))
}

// isTerminal reports whether w is a character device (a terminal), for the progress line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// humanBytes writes n with a binary unit and two decimals, for summaries.
func humanBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.2f %s", v, units[i])
}
