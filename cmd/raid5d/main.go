// Command raid5d assembles a RAID-5 array from member files or block devices and serves it over
// NBD. Run `raid5d help` for the subcommands.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=..."; otherwise it comes from the
// module build information.
var version = ""

func versionString() string {
	v := version
	if v == "" {
		v = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok {
			if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v += "+" + s.Value[:12]
				}
			}
		}
	}
	return "raid5d " + v
}

type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"create", "write superblocks to new members and make an array", runCreate},
	{"serve", "assemble an array and serve it over NBD", runServe},
	{"status", "report the array: the running daemon's view, or the members' superblocks offline", runStatus},
	{"fail", "mark a member of the running array faulty", runFail},
	{"remove", "remove a faulty member or a spare from the running array", runRemove},
	{"add", "add a spare to the running array (a rebuild starts if it is degraded)", runAdd},
	{"replace", "rebuild a member's role onto a new member, then retire the old one", runReplace},
	{"re-add", "bring a failed member back, resyncing only what changed while it was away", runReAdd},
	{"scrub", "check or repair the running array's parity in the background, or stop that", runScrub},
	{"rebuild", "set the running array's rebuild and scrub speed limits", runRebuild},
	{"bench", "drive any NBD export with a verifying load: throughput, latency, crash checks", runBench},
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `raid5d is a software RAID-5 daemon that serves its array over NBD.

Usage:
  raid5d COMMAND [flags] MEMBER...

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `
  raid5d COMMAND --help    flags of one command
  raid5d --version         print the version

A MEMBER is a regular file, a block device, or an NBD export on another host: nbd://host[:port]/export,
nbds://... (TLS: --member-tls-ca/-cert/-key) or nbd+unix:///export?socket=PATH. Sizes are bytes or take a binary suffix: 64K, 256M, 1G.

Quick start:
  raid5d create --size 256M data/m0.img data/m1.img data/m2.img data/m3.img
  raid5d serve data/m0.img data/m1.img data/m2.img data/m3.img
  raid5d bench --rw randwrite --verify --time 10s nbd://127.0.0.1:10809/raid5d

As a service: raid5d serve --config /etc/raid5d/EXPORT.toml (dist/raid5d@.service,
dist/raid5d.example.toml; see raid5d serve --help).

Managing a running array (through its control socket, see raid5d serve --help):
  raid5d status                      raid5d fail 2            raid5d add data/spare.img
  raid5d scrub check --wait          raid5d remove 2          raid5d rebuild --speed-max 50M

Exit status: 0 done, 1 error, 2 usage error, 3 degraded (status), 4 no daemon answers at the
control socket, 5 parity mismatches found (scrub check --wait), 130 or 143 serve stopped by a
second SIGINT or SIGTERM (the array left dirty).
`)
}

// errUsage marks an error in the command line: main prints it and exits 2.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, versionString())
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errDegraded):
			fmt.Fprintf(stderr, "raid5d %s: %v\n", c.name, err)
			return 3
		case errors.As(err, new(*exitError)):
			var e *exitError
			errors.As(err, &e)
			fmt.Fprintf(stderr, "raid5d %s: %v\n", c.name, err)
			return e.code
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "raid5d %s: %v\nRun 'raid5d %s --help' for usage.\n", c.name, err, c.name)
			return 2
		default:
			fmt.Fprintf(stderr, "raid5d %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "raid5d: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// newFlagSet returns a flag set whose --help prints the command's synopsis, description and
// every flag, and whose parse errors come back as errors rather than exiting.
func newFlagSet(name, synopsis, description string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: raid5d %s %s\n\n%s\n\nFlags:\n", name, synopsis, description)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args, printing the usage for --help, and returns the positional arguments.
// Flags may come before, between or after positional arguments; "--" ends the flags.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	// flag.Parse calls Usage itself on -help and on every error; print it once, for -help only.
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				usage()
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		// fs.Parse stops at the first non-flag or after "--".
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
