package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raid5d/raid5d/raid"
)

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "MEMBER...",
		`Reads the superblocks of the MEMBERs (never writes) and prints the array's geometry, each
member's role, events counter and state, and what is missing or stale. Run it while the array is
not being served (a running daemon's superblocks may be a moment behind).

Exit status: 0 clean or active, 1 on an error or a failed array (two or more members missing),
3 degraded.`, stdout)
	paths, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(paths) == 0 {
		return fmt.Errorf("%w: no members given", errUsage)
	}
	rep, err := raid.Examine(paths)
	if rep != nil {
		printReport(stdout, rep)
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
			if m.Role < 0 || m.Stale {
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
	case rep.Failed():
		return fmt.Sprintf(" (%d members missing: the data cannot be served)", len(rep.Missing))
	case rep.Degraded():
		return fmt.Sprintf(" (role %d missing: served from parity, no redundancy left)", rep.Missing[0])
	case rep.Dirty:
		return " (not shut down cleanly, or being served now: parity may need a resync)"
	}
	return ""
}
