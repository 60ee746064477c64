package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raid5d/raid5d/cmd/raid5d/internal/control"
)

// barWidth is the number of cells between the brackets of a progress bar.
const barWidth = 20

// progressBar draws pct (0 to 100) the way /proc/mdstat does: [=========>          ].
func progressBar(pct float64) string {
	n := int(pct * barWidth / 100)
	switch {
	case n >= barWidth:
		return "[" + strings.Repeat("=", barWidth) + "]"
	case n < 0:
		n = 0
	}
	return "[" + strings.Repeat("=", n) + ">" + strings.Repeat(" ", barWidth-n-1) + "]"
}

// formatRate is bytes per second for people: 52.4M, 1M, 900K.
func formatRate(b int64) string {
	units := []string{"", "K", "M", "G", "T"}
	f := float64(b)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d%s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

func formatETA(sec float64) string {
	if sec <= 0 {
		return "-"
	}
	return time.Duration(sec * float64(time.Second)).Round(time.Second).String()
}

// progressLine is one line for a running rebuild or scrub:
// [=========>          ]  45.2% (28.8M/63M) 50.1M/s, ETA 1s
func progressLine(p *control.Progress) string {
	s := fmt.Sprintf("%s %5.1f%% (%s/%s) %s/s, ETA %s", progressBar(p.Percent()), p.Percent(),
		formatRate(p.Done), formatRate(p.Total), formatRate(int64(p.BytesPerSec)), formatETA(p.ETASeconds))
	if p.Kind != "rebuild" {
		s += ", " + mismatchText(p)
	}
	if p.Resumed > 0 {
		s += fmt.Sprintf(", resumed from %s", formatRate(p.Resumed))
	}
	if p.ReAdd {
		s += fmt.Sprintf(", re-add: %s resynced", formatRate(p.Resynced))
	}
	return s
}

func mismatchText(p *control.Progress) string {
	s := count(p.Mismatches, "mismatch", "mismatches")
	if len(p.MismatchAt) > 0 {
		at := make([]string, len(p.MismatchAt))
		for i, n := range p.MismatchAt {
			at[i] = fmt.Sprint(n)
		}
		more := ""
		if int64(len(at)) < p.Mismatches {
			more = ", ..."
		}
		word := "stripes "
		if p.Mismatches == 1 {
			word = "stripe "
		}
		s += " (" + word + strings.Join(at, ", ") + more + ")"
	}
	return s
}

// roleMap is mdstat's [UU_U]: U for a role with an active member, _ otherwise.
func roleMap(st *control.Status) string {
	up := make([]bool, st.Disks)
	for _, m := range st.Members {
		if m.State == control.StateActive && m.Role >= 0 && m.Role < st.Disks {
			up[m.Role] = true
		}
	}
	n := 0
	var b strings.Builder
	for _, u := range up {
		if u {
			n++
			b.WriteByte('U')
		} else {
			b.WriteByte('_')
		}
	}
	return fmt.Sprintf("[%d/%d] [%s]", st.Disks, n, b.String())
}

// printSummary is the few lines a management command prints after its request.
func printSummary(w io.Writer, st *control.Status) {
	fmt.Fprintf(w, "array %s: %s %s\n", st.UUID, stateWords(st), roleMap(st))
	if p := st.Sync; p != nil {
		fmt.Fprintf(w, "  %s: %s\n", syncName(p), progressLine(p))
	}
}

func syncName(p *control.Progress) string {
	if p.Kind == "rebuild" && p.Role >= 0 {
		return fmt.Sprintf("rebuild of role %d", p.Role)
	}
	if p.Kind == "rebuild" {
		return "rebuild"
	}
	return "scrub " + p.Kind
}

func stateWords(st *control.Status) string {
	s := st.State
	if p := st.Sync; p != nil {
		switch p.Kind {
		case "rebuild":
			s += ", rebuilding"
		case "resync":
			s += ", resyncing"
		default:
			s += ", scrubbing (" + p.Kind + ")"
		}
	}
	if st.ReadOnly {
		s += ", read-only"
	}
	return s
}

// printOnline is raid5d status for a running daemon: /proc/mdstat and mdadm --detail in one.
func printOnline(w io.Writer, sock string, st *control.Status) {
	d := st.Daemon
	fmt.Fprintf(w, "online: daemon pid %d (%s) at control socket %s, serving export %q on %s since %s\n",
		d.PID, d.Version, sock, d.Export, d.Address, d.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "array %s\n", st.UUID)
	fmt.Fprintf(w, "  state:    %s%s\n", stateWords(st), onlineNote(st))
	fmt.Fprintf(w, "  level:    raid%d %s, chunk %s, %s\n", st.Level, roleMap(st), formatSize(st.Chunk), st.Layout)
	fmt.Fprintf(w, "  size:     %s (%d bytes)\n", formatSize(st.Size), st.Size)
	fmt.Fprintf(w, "  events:   %d\n", st.Events)
	if p := st.Sync; p != nil {
		fmt.Fprintf(w, "  %-9s %s\n", p.Kind+":", progressLine(p))
	}
	if p := st.LastResync; p != nil {
		fmt.Fprintf(w, "  last resync: %s, %s parity fixed\n", finishedOrStopped(p), count(p.Mismatches, "stripe's", "stripes'"))
	}
	if b := st.Bitmap; b != nil {
		fmt.Fprintf(w, "  bitmap:   %d regions of %s, %d set, %d bitmap writes\n", b.Regions, formatSize(b.RegionBytes), b.Set, b.Flushes)
	}
	if j := st.Journal; j != nil {
		if j.Missing {
			fmt.Fprintf(w, "  journal:  MISSING at %s: read-only until it is back (raid5d serve --journal PATH)\n", j.Path)
		} else {
			fmt.Fprintf(w, "  journal:  %s, %s of %s in use, %d records in %d writes, %d checkpoints, %d replayed at start\n",
				j.Path, formatSize(j.Used), formatSize(j.Size), j.Records, j.Commits, j.Checkpoints, j.Replayed)
		}
	} else if st.Consistency != "" && st.Bitmap == nil {
		fmt.Fprintf(w, "  policy:   %s\n", st.Consistency)
	}
	if p := st.LastScrub; p != nil {
		fmt.Fprintf(w, "  last scrub: %s %s, %s", p.Kind, finishedOrStopped(p), mismatchText(p))
		if p.Err != "" {
			fmt.Fprintf(w, " (%s)", p.Err)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  speed:    min %s/s, max %s/s (raid5d rebuild --speed-min/--speed-max)\n",
		formatRate(st.SyncSpeedMin), formatRate(st.SyncSpeedMax))
	fmt.Fprintln(w, "members:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ROLE\tPATH\tSTATE\tEVENTS\tREAD-ERRORS\tWRITE-ERRORS\tDEVICE\tIO")
	for _, m := range st.Members {
		role := "-"
		if m.Role >= 0 {
			role = fmt.Sprint(m.Role)
		}
		state := m.State
		if m.State == control.StateRebuilding {
			state = fmt.Sprintf("rebuilding into role %d", m.Role)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", role, m.Path, state, m.Events, m.ReadErrors, m.WriteErrors, m.Device, ioMode(m))
	}
	tw.Flush()
	if len(st.Missing) > 0 {
		roles := make([]string, len(st.Missing))
		for i, r := range st.Missing {
			roles[i] = fmt.Sprint(r)
		}
		fmt.Fprintf(w, "missing: role %s\n", strings.Join(roles, ", role "))
	}
	printRemote(w, st)
	printAutoReAdd(w, st.AutoReAdd)
	c := st.Counters
	fmt.Fprintln(w, "counters:")
	fmt.Fprintf(w, "  writes:  %d full-stripe, %d read-modify-write, %d reconstruct-write, %d write-through\n",
		c.FullStripeWrites, c.RMWWrites, c.RCWWrites, c.WriteThroughs)
	fmt.Fprintf(w, "  members: %d bytes read (%d sent from the mappings), %d bytes written (%d through the mappings); %d bytes copied into the cache\n",
		c.MemberBytesRead, c.MappedBytesRead, c.MemberBytesWritten, c.MappedBytesWritten, c.CopiedBytes)
	fmt.Fprintf(w, "  placed:  %d bytes of writes read from the socket straight into the members\n", c.PlacedBytes)
	fmt.Fprintf(w, "  cache:   %d stripes, %d hits, %d misses, %d evictions\n",
		c.CacheStripes, c.CacheHits, c.CacheMisses, c.CacheEvictions)
}

// ioMode is the members table's IO column: direct (O_DIRECT), buffered (through the page
// cache), or a remote member's kind (nbd), which has no local file.
func ioMode(m control.MemberStatus) string {
	switch {
	case m.Remote != nil:
		return m.Remote.Kind
	case m.Direct:
		return "direct"
	}
	return "buffered"
}

func onlineNote(st *control.Status) string {
	switch {
	case st.State == "failed":
		return fmt.Sprintf(" (%d roles without a working member: data there cannot be served)", len(st.Missing))
	case st.Sync != nil && st.Sync.Kind == "rebuild" && st.Sync.Role >= 0:
		return fmt.Sprintf(" (role %d being rebuilt: no redundancy until it finishes)", st.Sync.Role)
	case st.WriteHole:
		return " (WRITE HOLE: assembled after an unclean shutdown while degraded; chunks of the missing member in stripes being written at the crash may be wrong)"
	case len(st.Missing) > 0:
		return fmt.Sprintf(" (role %d missing: served from parity, no redundancy left)", st.Missing[0])
	case st.Unclean:
		return " (assembled after an unclean shutdown: resyncing parity)"
	}
	return ""
}

// printRemote is the section on the remote members: for each, its link, its server's export
// and flags, and how its requests fare. The latency is that of the last interval (about 10 s),
// mean and longest: the mean says how the member does now, the longest catches the stall a
// mean hides (one request that waited for a reconnect, a deadline); the totals since the
// member was opened are in --json and the metrics.
func printRemote(w io.Writer, st *control.Status) {
	first := true
	for _, m := range st.Members {
		r := m.Remote
		if r == nil {
			continue
		}
		if first {
			fmt.Fprintln(w, "remote members:")
			first = false
		}
		role := "spare"
		if m.Role >= 0 {
			role = fmt.Sprintf("role %d", m.Role)
		}
		fmt.Fprintf(w, "  %s (%s, %s): %s, %s, %s\n", m.Path, role, m.State, r.State,
			plural(r.Connections, "connection"), plural(int(r.Reconnects), "reconnect"))
		flags := strings.Join(r.Flags, " ")
		if flags == "" {
			flags = "none"
		}
		named := ""
		if r.ServerName != "" && r.ServerName != r.Export {
			named = fmt.Sprintf(" (the server names it %q)", r.ServerName)
		}
		fmt.Fprintf(w, "    server:   %s export %q%s, flags %s; block sizes min %s, preferred %s, max %s\n",
			r.Kind, r.Export, named, flags, formatRate(r.MinBlock), formatRate(r.PreferredBlock), formatRate(r.MaxBlock))
		fmt.Fprintf(w, "    requests: %d in flight, %d answered (%d failed)\n", r.InFlight, r.Requests, r.Errors)
		l := r.Latency
		over := "over the last " + formatLatency(seconds(l.WindowSeconds))
		if l.Requests == 0 {
			fmt.Fprintf(w, "    latency:  no requests answered %s\n", over)
		} else {
			fmt.Fprintf(w, "    latency:  mean %s, max %s %s (%d requests)\n",
				formatLatency(seconds(l.MeanSeconds)), formatLatency(seconds(l.MaxSeconds)), over, l.Requests)
		}
	}
}

// printAutoReAdd is the line on serve --auto-re-add, and one per member it probes.
func printAutoReAdd(w io.Writer, ar *control.AutoReAdd) {
	if ar == nil {
		return
	}
	if len(ar.Members) == 0 {
		fmt.Fprintln(w, "auto re-add: on, no remote member away")
		return
	}
	fmt.Fprintln(w, "auto re-add: on, probing the away remote members:")
	for _, m := range ar.Members {
		switch {
		case m.Refused:
			fmt.Fprintf(w, "  %s: REFUSED, left to the operator (raid5d add rebuilds it in full): %s\n", m.Member, m.Error)
		case m.Next != nil && m.Error != "":
			fmt.Fprintf(w, "  %s: %s, next %s: %s\n", m.Member, plural(m.Probes, "probe"), untilText(*m.Next), m.Error)
		case m.Next != nil:
			fmt.Fprintf(w, "  %s: first probe %s\n", m.Member, untilText(*m.Next))
		}
	}
}

// untilText is when t comes: "in 8s", or "now" if it has.
func untilText(t time.Time) string {
	if d := time.Until(t); d > 0 {
		return "in " + d.Round(time.Second).String()
	}
	return "now"
}

// plural is n what, with an s unless n is 1: "1 stripe", "3 stripes".
func plural[N ~int | ~int64](n N, what string) string { return count(n, what, what+"s") }

// count is n one if n is 1, else n many: "1 mismatch", "0 mismatches".
func count[N ~int | ~int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// formatLatency is a request time (or an interval) for people, to three significant digits or
// so: 212µs, 3.41ms, 10.02s.
func formatLatency(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}
