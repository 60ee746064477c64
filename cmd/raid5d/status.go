package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
	"github.com/raid5d/raid5d/raid"
)

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "[flags] [MEMBER...]",
		`Reports the array. Online: when a daemon answers at the control socket, it reports the running
array as /proc/mdstat and mdadm --detail would: state, members with their roles, states,
read/write errors and how each is open (IO: direct, buffered, or a remote member's kind), a rebuild or scrub in progress with a progress bar, speed and ETA, the last
scrub's mismatch count, the speed limits and the I/O counters. Offline: when no daemon answers and
MEMBERs are given, it reads their superblocks (never writes) and prints the geometry, each member's
role, events counter and state, and what is missing or stale. The first line says which.
With MEMBERs given and a daemon answering that serves none of them, the report is offline.

`+controlHelp+`

Exit status: 0 clean or active, 1 on an error or a failed array (two or more members missing),
2 usage error (also when no daemon answers and no MEMBERs are given), 3 degraded (also while a
rebuild runs).`, stdout)
	cf := addControlFlags(fs, "export `name` of the daemon, to find its default control socket")
	asJSON := fs.Bool("json", false, "print the status as JSON (its \"source\" says online or offline)")
	setMemberOpts := memberFlags(fs)
	paths, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	setMemberOpts(0)
	sock := cf.socket()
	st, err := control.Do(sock, control.Request{Op: control.OpStatus})
	switch {
	case err == nil && servesAny(st, paths):
		st.Source = "online"
		if *asJSON {
			if err := writeJSON(stdout, st); err != nil {
				return err
			}
		} else {
			printOnline(stdout, sock, st)
		}
		return onlineExit(st)
	case err == nil:
		// A daemon answers, but for another array.
	case !errors.Is(err, control.ErrNoDaemon):
		return err
	case len(paths) == 0:
		// Neither a daemon nor MEMBERs: a usage error, as before there was a control socket.
		return fmt.Errorf("%w: no members given, and %v; or give the MEMBERs to read their superblocks offline",
			errUsage, noDaemon(sock))
	}
	rep, err := raid.Examine(paths)
	if rep != nil {
		if *asJSON {
			if err := writeJSON(stdout, offlineStatus(rep)); err != nil {
				return err
			}
		} else {
			if st != nil {
				fmt.Fprintf(stdout, "offline: the daemon at %s serves other members; read from these members' superblocks\n", sock)
			} else {
				fmt.Fprintf(stdout, "offline: no daemon answers at %s; read from the members' superblocks\n", sock)
			}
			printReport(stdout, rep)
		}
	}
	if err != nil {
		return err
	}
	switch {
	case rep.Failed():
		return fmt.Errorf("array %s has failed: %d members missing", rep.UUID, len(rep.Missing))
	case rep.Degraded():
		return errDegraded
	}
	return nil
}

// servesAny reports whether the daemon's array has one of paths as a member (or paths is empty).
func servesAny(st *control.Status, paths []string) bool {
	if len(paths) == 0 {
		return true
	}
	for _, p := range paths {
		abs, _ := filepath.Abs(p)
		for _, m := range st.Members {
			if m.Path == p || m.Path == abs {
				return true
			}
		}
	}
	return false
}

func onlineExit(st *control.Status) error {
	switch {
	case st.State == raid.StateFailed.String():
		return fmt.Errorf("array %s has failed: %d roles without a working member", st.UUID, len(st.Missing))
	case len(st.Missing) > 0 || st.State == raid.StateDegraded.String():
		return errDegraded
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// offlineStatus is the JSON form of an offline report.
func offlineStatus(rep *raid.Report) *control.Status {
	st := &control.Status{
		Source: "offline", UUID: rep.UUID.String(), State: rep.State.String(), Dirty: rep.Dirty,
		Events: rep.Events, Size: rep.Size, Level: 5, Disks: rep.Layout.Members(), Chunk: rep.Layout.ChunkSize(),
		Missing: rep.Missing, Members: []control.MemberStatus{}, Consistency: rep.Consistency,
		DirtyDegraded: rep.DirtyDegraded,
	}
	for _, r := range rep.AtRisk {
		st.AtRisk = append(st.AtRisk, control.Range{Off: r.Off, Len: r.Len})
	}
	if st.Disks > 0 {
		st.Layout = rep.Layout.Algorithm().String()
	}
	for _, m := range rep.Members {
		ms := control.MemberStatus{Path: m.Path, Role: m.Role, State: control.StateActive, Events: m.Events, Device: m.Device.String()}
		switch {
		case errors.Is(m.Err, os.ErrNotExist):
			ms.State, ms.Device = "missing", ""
		case m.Err != nil:
			ms.State, ms.Device = "refused: "+m.Err.Error(), ""
		case m.Stale:
			ms.State = "stale"
		case m.Role < 0:
			ms.State = control.StateSpare
		}
		st.Members = append(st.Members, ms)
	}
	return st
}

// errDegraded makes `raid5d status` exit 3, so scripts can tell degraded from failed.
var errDegraded = errors.New("array is degraded")

func printReport(w io.Writer, rep *raid.Report) {
	if rep.Layout.Members() > 0 {
		l := rep.Layout
		fmt.Fprintf(w, "array %s\n", rep.UUID)
		fmt.Fprintf(w, "  state:   %s%s\n", rep.State, stateNote(rep))
		fmt.Fprintf(w, "  level:   raid5, %d members, chunk %s, %s\n", l.Members(), formatSize(l.ChunkSize()), l.Algorithm())
		fmt.Fprintf(w, "  size:    %s (%d bytes); %s of data per member at offset %s\n",
			formatSize(rep.Size), rep.Size, formatSize(rep.MemberData), formatSize(rep.DataOffset))
		fmt.Fprintf(w, "  events:  %d\n", rep.Events)
		if rep.Consistency == raid.ConsistencyJournal {
			fmt.Fprintf(w, "  policy:  journal, at %s\n", rep.JournalPath)
		} else {
			fmt.Fprintf(w, "  policy:  %s\n", rep.Consistency)
		}
		fmt.Fprintf(w, "  created: %s, updated %s\n", rep.Created.Format(time.RFC3339), rep.Updated.Format(time.RFC3339))
	}
	fmt.Fprintln(w, "members:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ROLE\tPATH\tEVENTS\tSTATE\tDEVICE")
	for _, m := range rep.Members {
		role, events, state, dev := "-", "-", "active", m.Device.String()
		if m.Role >= 0 {
			role = fmt.Sprint(m.Role)
			events = fmt.Sprint(m.Events)
		}
		switch {
		case errors.Is(m.Err, os.ErrNotExist):
			state, dev = "missing: no such file", "-"
		case m.Err != nil:
			state, dev = "refused: "+m.Err.Error(), "-"
		case m.Stale:
			state = "stale: events behind the array's, it missed writes"
		case m.Role < 0:
			state = "spare"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", role, m.Path, events, state, dev)
	}
	tw.Flush()
	if len(rep.Missing) > 0 {
		roles := make([]string, len(rep.Missing))
		for i, r := range rep.Missing {
			roles[i] = fmt.Sprint(r)
		}
		fmt.Fprintf(w, "missing: role %s", strings.Join(roles, ", role "))
		var unread []string
		for _, m := range rep.Members {
			if m.Err != nil || m.Stale {
				unread = append(unread, m.Path)
			}
		}
		if len(unread) > 0 {
			fmt.Fprintf(w, " (unusable paths given: %s)", strings.Join(unread, ", "))
		}
		fmt.Fprintln(w)
	}
}

func stateNote(rep *raid.Report) string {
	switch {
	case rep.Failed() && len(rep.Forceable) > 0:
		return fmt.Sprintf(" (%d members missing; %s stopped only when the array failed: serve --force can assemble it, see what serve says it would do)",
			len(rep.Missing), strings.Join(rep.Forceable, ", "))
	case rep.Failed():
		return fmt.Sprintf(" (%d members missing: the data cannot be served)", len(rep.Missing))
	case rep.DirtyDegraded:
		return fmt.Sprintf(" (role %d missing, and not shut down cleanly: serve refuses it, as stripes were being written at the crash — the write hole, %s at risk —"+
			" until the member is back, or with --force; see README, \"Assembly\")", rep.Missing[0], formatSize(rangesLen(rep.AtRisk)))
	case rep.Degraded() && rep.Dirty && rep.Consistency != raid.ConsistencyJournal && rebuilding(rep):
		return fmt.Sprintf(" (role %d being rebuilt, and not shut down cleanly: serve resumes the rebuild; stripes above its position being written at the crash may be torn — the write hole)", rep.Missing[0])
	case rep.Degraded() && rep.Dirty && rep.Consistency != raid.ConsistencyJournal:
		return fmt.Sprintf(" (role %d missing, and not shut down cleanly, but no stripe was being written at the crash: served from parity, no redundancy left)", rep.Missing[0])
	case rep.Degraded():
		return fmt.Sprintf(" (role %d missing: served from parity, no redundancy left)", rep.Missing[0])
	case rep.Dirty:
		return " (not shut down cleanly, or being served now: parity may need a resync)"
	}
	return ""
}

// stoppedMessage is serve's last log line after the array closed: what the stop left in the
// superblocks. A failed array is never marked clean, nor one whose resync has not finished.
func stoppedMessage(st raid.Status) string {
	switch {
	case st.State == raid.StateFailed:
		return "stopped: the array has failed; its members are left as they were at the failure, not marked clean (serve --force may bring it back)"
	case st.ReadOnly:
		return "stopped: requests drained; read-only, nothing written"
	case st.Dirty:
		return "stopped: requests drained, members flushed; the array stays marked dirty (its resync after an unclean shutdown has not finished)"
	}
	return "stopped: requests drained, members flushed, array marked clean"
}

// rangesLen is the bytes rs cover.
func rangesLen(rs []raid.Range) int64 {
	var n int64
	for _, r := range rs {
		n += r.Len
	}
	return n
}

// rebuilding reports whether the role a degraded report misses has a member being rebuilt
// into it (a current member of that role: Examine counts it missing).
func rebuilding(rep *raid.Report) bool {
	for _, m := range rep.Members {
		if m.Role == rep.Missing[0] && m.Err == nil && !m.Stale {
			return true
		}
	}
	return false
}
