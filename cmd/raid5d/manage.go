package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/raid"
)

// Exit statuses of the management commands (besides 0 success, 1 error, 2 usage, 3 degraded).
const (
	exitNoDaemon   = 4 // nothing answers at the control socket
	exitMismatches = 5 // scrub check --wait found parity mismatches
)

// exitError makes run exit with a given status after printing the error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }
func (e *exitError) ExitCode() int { return e.code }

const controlHelp = `The control socket: --control PATH, the same for serve and every management command. Default:
/run/raid5d/EXPORT.sock when run as root and /run exists, else $XDG_RUNTIME_DIR/raid5d/EXPORT.sock,
else /tmp/raid5d-UID/EXPORT.sock; EXPORT is --export (default raid5d).`

const manageExitHelp = `Exit status: 0 done, 1 the daemon refused or failed the request, 2 usage error,
4 no daemon answers at the control socket.`

// defaultControlPath is where serve listens for management requests and where the management
// commands look, unless --control says otherwise.
func defaultControlPath(export string) string {
	return controlPathFor(export, os.Geteuid(), dirExists("/run"), os.Getenv("XDG_RUNTIME_DIR"), os.TempDir())
}

func controlPathFor(export string, euid int, haveRun bool, xdg, tmp string) string {
	name := export + ".sock"
	switch {
	case euid == 0 && haveRun:
		return filepath.Join("/run/raid5d", name)
	case xdg != "":
		return filepath.Join(xdg, "raid5d", name)
	}
	return filepath.Join(tmp, fmt.Sprintf("raid5d-%d", euid), name)
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// controlFlags are --control and --export, shared by serve and the management commands.
type controlFlags struct {
	path, export *string
}

func addControlFlags(fs *flag.FlagSet, exportUsage string) controlFlags {
	return controlFlags{
		path:   fs.String("control", "", "control socket `path` (default: see above)"),
		export: fs.String("export", "raid5d", exportUsage),
	}
}

// socket is the control socket path the flags name.
func (c controlFlags) socket() string {
	if *c.path != "" {
		return *c.path
	}
	return defaultControlPath(*c.export)
}

// ask sends req to the daemon at the control socket, turning "nobody there" into an error that
// says how to find the daemon, with exit status 4.
func ask(sock string, req control.Request) (*control.Status, error) {
	st, err := control.Do(sock, req)
	if errors.Is(err, control.ErrNoDaemon) {
		return nil, noDaemon(sock)
	}
	return st, err
}

func noDaemon(sock string) error {
	return &exitError{exitNoDaemon, fmt.Errorf("no raid5d daemon answers at the control socket %s: is `raid5d serve` running? "+
		"Point --control at the socket it was started with (or --export at its export name)", sock)}
}

// memberArg is a MEMBER argument as the daemon wants it: a role number as is, a path (or the
// path in a faulty: spec) made absolute, as serve makes its member paths.
func memberArg(s string) (string, error) {
	if _, err := strconv.Atoi(s); err == nil {
		return s, nil
	}
	return absMember(s)
}

func newManageFlagSet(name, synopsis, description string, stdout io.Writer) (*flag.FlagSet, controlFlags) {
	fs := newFlagSet(name, synopsis, description+"\n\n"+controlHelp+"\n\n"+manageExitHelp, stdout)
	return fs, addControlFlags(fs, "export `name` of the daemon, to find its default control socket")
}

// forceHint adds to a refusal that --force would override what --force would do.
func forceHint(err error) error {
	switch {
	case errors.Is(err, control.ErrWouldFail):
		return fmt.Errorf("%w\n(--force does it anyway: the array fails, and the data of its lost roles can no longer be read)", err)
	case errors.Is(err, control.ErrInUse):
		return fmt.Errorf("%w\n(--force overwrites it, destroying that array's copy there)", err)
	}
	return err
}

// runMemberOp is fail and remove: one MEMBER, one request; withForce adds --force.
func runMemberOp(op, synopsis, description, did string, withForce bool) func(args []string, stdout, stderr io.Writer) error {
	return func(args []string, stdout, stderr io.Writer) error {
		fs, cf := newManageFlagSet(op, synopsis, description, stdout)
		var force *bool
		if withForce {
			force = fs.Bool("force", false, "fail MEMBER even if that fails the array (two roles without a working member)")
		}
		args, err := parseFlags(fs, args)
		if err != nil {
			return err
		}
		if len(args) != 1 {
			return fmt.Errorf("%w: want one MEMBER (a path or a role number), got %d arguments", errUsage, len(args))
		}
		m, err := memberArg(args[0])
		if err != nil {
			return err
		}
		req := control.Request{Op: op, Member: m, Force: force != nil && *force}
		st, err := ask(cf.socket(), req)
		if err != nil {
			return forceHint(err)
		}
		fmt.Fprintf(stdout, "%s %s\n", did, args[0])
		printSummary(stdout, st)
		return nil
	}
}

var runFail = runMemberOp(control.OpFail, "[flags] MEMBER",
	`Marks MEMBER of the running array faulty, as if it had failed: it is no longer read or written,
the other members' superblocks record it, and the array runs degraded. If a spare is present its
rebuild starts at once. MEMBER is a member's path or its role number (0, 1, ...). A MEMBER whose
loss would fail the array is refused (exit 1) unless --force is given: a second role without a
working member, counting a role still being rebuilt onto a spare (its member does not yet hold the
stripes the rebuild has not reached).`, "marked faulty:", true)

var runReAdd = runMemberOp(control.OpReAdd, "MEMBER",
	`Brings MEMBER back into the running array, a member that failed, was removed or was missing at
assembly and whose superblock is intact (mdadm --re-add): instead of a full rebuild, only the
regions the write-intent bitmap marks as written while it was away are resynced onto it; it
serves the stripes below the resync position meanwhile and becomes active when the resync ends
(watch it with raid5d status). MEMBER is its path (or URI), or the role number of a failed member
the daemon still holds. Refused (exit 1) for another array's member, a spare, a role that has a
working member, a member whose events counter is older than the bitmap's last clear (its role was
rebuilt meanwhile), and an array without a bitmap: raid5d add rebuilds it fully instead.`, "re-adding:", false)

var runRemove = runMemberOp(control.OpRemove, "[flags] MEMBER",
	`Removes MEMBER, a faulty member or a spare, from the running array: the daemon closes it and
no longer lists it, and it may be added again (raid5d add). Active and rebuilding members are
refused (fail them first), so remove never takes redundancy away. MEMBER is a path or a role
number.`, "removed:", false)

func runAdd(args []string, stdout, stderr io.Writer) error {
	fs, cf := newManageFlagSet("add", "[flags] PATH",
		`Adds PATH (an existing file or block device at least as large as the other members) to the
running array as a spare: the daemon writes a spare superblock on it. If the array is degraded,
the rebuild onto it starts at once; watch it with raid5d status. Whatever PATH held is
overwritten, but a PATH that carries another array's raid5d superblock or journal is refused
unless --force is given (as raid5d create refuses it). A member removed earlier may be added again.`, stdout)
	force := fs.Bool("force", false, "overwrite PATH even if it belongs to another array")
	args, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(args) != 1 {
		return fmt.Errorf("%w: want one PATH, got %d arguments", errUsage, len(args))
	}
	p, err := absMember(args[0]) // a path made absolute; a remote member's URI as is
	if err != nil {
		return err
	}
	st, err := ask(cf.socket(), control.Request{Op: control.OpAdd, Path: p, Force: *force})
	if err != nil {
		return forceHint(err)
	}
	fmt.Fprintf(stdout, "added spare: %s\n", p)
	printSummary(stdout, st)
	return nil
}

func runReplace(args []string, stdout, stderr io.Writer) error {
	fs, cf := newManageFlagSet("replace", "[flags] MEMBER PATH",
		`Replaces MEMBER (a path or role number) with PATH: PATH is added as a spare (its contents are
overwritten), MEMBER is failed, and MEMBER's role is rebuilt onto PATH; spares already there stay
spares. This is the simple version: the array runs degraded, with no redundancy, until the rebuild
ends (watch it with raid5d status); MEMBER is dropped when it does. Refused while a rebuild runs;
refused, unless --force is given, when the array is degraded (failing MEMBER would fail it) and
when PATH carries another array's raid5d superblock or journal.`, stdout)
	force := fs.Bool("force", false, "replace even if that fails the array, or PATH belongs to another array")
	args, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(args) != 2 {
		return fmt.Errorf("%w: want MEMBER and PATH, got %d arguments", errUsage, len(args))
	}
	m, err := memberArg(args[0])
	if err != nil {
		return err
	}
	p, err := absMember(args[1])
	if err != nil {
		return err
	}
	st, err := ask(cf.socket(), control.Request{Op: control.OpReplace, Member: m, Path: p, Force: *force})
	if err != nil {
		return forceHint(err)
	}
	fmt.Fprintf(stdout, "replacing %s with %s\n", args[0], p)
	printSummary(stdout, st)
	return nil
}

func runScrub(args []string, stdout, stderr io.Writer) error {
	fs, cf := newManageFlagSet("scrub", "[flags] check|repair|stop | check MEMBER...",
		`Starts or stops a background scrub of the running array, at the rebuild speed limits.
  check   reads every stripe and counts those whose parity does not match their data
  repair  does the same and rewrites the parity of those stripes
  stop    stops the scrub running now
The mismatch count and the first stripes found are shown by raid5d status. A scrub is refused
while a rebuild or another scrub runs, and on a degraded array (parity needs every member).

check MEMBER..., when no daemon answers at the control socket: checks the members of a
stopped (or crashed) array offline, reading only. Stripes that an unclean shutdown may have
left with a write under way (the write-intent bitmap's set regions, the journal's records, or
every stripe of a dirty array with neither) are counted apart: the next serve's resync or
replay rewrites their parity. A mismatch anywhere else is an acknowledged write whose parity
is wrong: they are listed, and the exit status is 5. Stripes where a role has no whole member
(missing, or being rebuilt above its recorded position) are skipped, and the output says so.
A member a running daemon holds is refused.`+"\n\nWith --wait, or offline, exit status 5 means check found mismatches.", stdout)
	wait := fs.Bool("wait", false, "check, repair: wait until the scrub finishes and print its result")
	poll := fs.Duration("poll", 500*time.Millisecond, "how often --wait asks the daemon (`duration`)")
	setMemberOpts := memberFlags(fs)
	args, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(args) > 1 && args[0] == control.ScrubCheck {
		setMemberOpts(0)
		return checkOffline(cf.socket(), args[1:], stdout)
	}
	if len(args) != 1 {
		return fmt.Errorf("%w: want one of check, repair, stop (or check MEMBER... offline)", errUsage)
	}
	action := args[0]
	switch action {
	case control.ScrubCheck, control.ScrubRepair:
	case control.ScrubStop:
		if *wait {
			return fmt.Errorf("%w: --wait goes with check or repair", errUsage)
		}
	default:
		return fmt.Errorf("%w: scrub %q: want check, repair or stop", errUsage, action)
	}
	sock := cf.socket()
	st, err := ask(sock, control.Request{Op: control.OpScrub, Action: action})
	if err != nil {
		return err
	}
	if action == control.ScrubStop {
		fmt.Fprintln(stdout, "scrub stopped")
		printSummary(stdout, st)
		return nil
	}
	if !*wait {
		fmt.Fprintf(stdout, "scrub %s started\n", action)
		printSummary(stdout, st)
		return nil
	}
	for st.Sync != nil && st.Sync.Kind == action {
		time.Sleep(*poll)
		if st, err = ask(sock, control.Request{Op: control.OpStatus}); err != nil {
			return err
		}
	}
	last := st.LastScrub
	if last == nil || last.Kind != action {
		return fmt.Errorf("scrub %s ended without a result in the daemon's status", action)
	}
	fmt.Fprintf(stdout, "scrub %s %s: %s\n", action, finishedOrStopped(last), mismatchText(last))
	if action == control.ScrubCheck && last.Mismatches > 0 {
		return &exitError{exitMismatches, fmt.Errorf("scrub check found %s with mismatched parity", plural(last.Mismatches, "stripe"))}
	}
	if last.Done < last.Total {
		why := ""
		if last.Err != "" {
			why = ": " + last.Err
		}
		return fmt.Errorf("scrub %s was stopped at %.1f%%%s", action, last.Percent(), why)
	}
	return nil
}

func finishedOrStopped(p *control.Progress) string {
	if p.Done < p.Total {
		return fmt.Sprintf("stopped at %.1f%%", p.Percent())
	}
	return "finished"
}

func runRebuild(args []string, stdout, stderr io.Writer) error {
	fs, cf := newManageFlagSet("rebuild", "[flags] --speed-min RATE --speed-max RATE",
		`Sets the running array's rebuild and scrub speed limits, like md's sync_speed_min/max: a
rebuild or scrub always goes at least --speed-min per second and yields to client I/O above it, up
to --speed-max. RATE is bytes per second with an optional binary suffix (1M = 1 MiB/s). Each
limit left out is unchanged; the daemon starts at 1M and 200M. Prints the limits in force.`, stdout)
	var lo, hi sizeFlag
	fs.Var(&lo, "speed-min", "guaranteed rebuild/scrub `rate` per second, e.g. 1M")
	fs.Var(&hi, "speed-max", "upper bound of the rebuild/scrub `rate` per second, e.g. 200M")
	args, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(args) != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, args)
	}
	if lo.n == 0 && hi.n == 0 {
		return fmt.Errorf("%w: give --speed-min, --speed-max or both", errUsage)
	}
	if lo.n > 0 && hi.n > 0 && lo.n > hi.n {
		return fmt.Errorf("%w: --speed-min %s is above --speed-max %s", errUsage, formatSize(lo.n), formatSize(hi.n))
	}
	st, err := ask(cf.socket(), control.Request{Op: control.OpSpeed, Min: lo.n, Max: hi.n})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebuild speed: min %s/s, max %s/s\n", formatRate(st.SyncSpeedMin), formatRate(st.SyncSpeedMax))
	return nil
}

// checkOffline is scrub check MEMBER... (raid.CheckParity), unless a daemon answers at sock
// serving one of paths: then it is refused, as the daemon is writing them.
func checkOffline(sock string, paths []string, stdout io.Writer) error {
	st, err := control.Do(sock, control.Request{Op: control.OpStatus})
	switch {
	case err == nil && servesAny(st, paths):
		return fmt.Errorf("%w: the daemon at %s serves these members: run scrub check without MEMBERs to check them online", errUsage, sock)
	case err != nil && !errors.Is(err, control.ErrNoDaemon):
		return err
	}
	pc, err := raid.CheckParity(paths)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "offline: no daemon serves these members; read from the members, nothing written\n")
	if pc.Unchecked != "" {
		fmt.Fprintf(stdout, "not checked: %s\n", pc.Unchecked)
	}
	fmt.Fprintf(stdout, "scrub check offline: %d of %s checked; %d in regions an unclean shutdown left dirty (%d with mismatched parity: the next serve's resync or replay rewrites them); %s elsewhere\n",
		pc.Checked, plural(pc.Stripes, "stripe"), pc.Dirty, pc.DirtyMismatches, count(pc.Mismatches, "mismatch", "mismatches"))
	if pc.Mismatches == 0 {
		return nil
	}
	ss := pc.Report.Layout.StripeSize()
	parts := make([]string, len(pc.First))
	for i, s := range pc.First {
		parts[i] = fmt.Sprintf("stripe %d (array bytes %d-%d)", s, s*ss, (s+1)*ss-1)
	}
	fmt.Fprintf(stdout, "mismatched parity outside the dirty regions (acknowledged writes with wrong parity): %s\n", strings.Join(parts, ", "))
	return &exitError{exitMismatches, fmt.Errorf("scrub check found %s with mismatched parity outside the regions an unclean shutdown left dirty", plural(pc.Mismatches, "stripe"))}
}
