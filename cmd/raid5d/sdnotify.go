package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
)

// notifier tells a service manager (systemd with Type=notify) how the daemon is doing, in the
// sd_notify(3) protocol: newline-separated KEY=VALUE lines in one datagram on the unixgram
// socket named by $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace, which Go's
// net package maps itself). A nil *notifier is valid and sends nothing: without a service
// manager every method is a no-op.
type notifier struct {
	conn *net.UnixConn
	// watchdog is how often to send WATCHDOG=1: half of $WATCHDOG_USEC, 0 for never.
	watchdog time.Duration
}

// newNotifier connects to the socket the environment names (getenv is os.Getenv, or a stand-in
// in tests). No NOTIFY_SOCKET gives a nil notifier and no error. The watchdog interval comes
// from WATCHDOG_USEC, unless WATCHDOG_PID names another process.
func newNotifier(getenv func(string) string, pid int) (*notifier, error) {
	path := getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil, nil
	}
	if !strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "@") {
		return nil, fmt.Errorf("NOTIFY_SOCKET=%q: want an absolute path or an @abstract name", path)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("NOTIFY_SOCKET: %w", err)
	}
	n := &notifier{conn: conn}
	if us := getenv("WATCHDOG_USEC"); us != "" {
		wpid := getenv("WATCHDOG_PID")
		v, err := strconv.ParseInt(us, 10, 64)
		if err == nil && v > 0 && (wpid == "" || wpid == strconv.Itoa(pid)) {
			n.watchdog = time.Duration(v) * time.Microsecond / 2
		}
	}
	return n, nil
}

// send sends lines (each KEY=VALUE, no newline inside a value) in one datagram.
func (n *notifier) send(lines ...string) error {
	if n == nil {
		return nil
	}
	_, err := n.conn.Write([]byte(strings.Join(lines, "\n") + "\n"))
	return err
}

// Close closes the socket.
func (n *notifier) Close() error {
	if n == nil {
		return nil
	}
	return n.conn.Close()
}

// statusLine keeps a STATUS= value on one line, as the protocol needs.
func statusLine(s string) string {
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}

// assemblingStatus is the STATUS= line while the array is assembled from n members, away the
// remote members that do not answer yet and are waited for (at most wait).
func assemblingStatus(n int, wait time.Duration, away []string) string {
	if len(away) == 0 {
		return fmt.Sprintf("assembling the array from %d members", n)
	}
	verb := "do"
	if len(away) == 1 {
		verb = "does"
	}
	return fmt.Sprintf("assembling the array from %d members: waiting up to %v for %s that %s not answer yet: %s",
		n, wait, plural(len(away), "remote member"), verb, strings.Join(away, ", "))
}

// notifyLoop reports to the service manager until ctx is done: READY=1 with the first status
// at once, a new STATUS= line whenever status() changes (checked every statusEvery), WATCHDOG=1
// every watchdog interval, and STOPPING=1 when ctx is done. The caller starts it when the
// daemon is ready (the array assembled, the listener accepting) and waits for it to return.
func (n *notifier) notifyLoop(ctx context.Context, status func() string, statusEvery time.Duration, log *slog.Logger) {
	if n == nil {
		return
	}
	report := func(lines ...string) {
		if err := n.send(lines...); err != nil {
			log.Warn("sd_notify", "message", strings.Join(lines, " "), "err", err)
		}
	}
	last := status()
	report("READY=1", statusLine(last))
	tick := time.NewTicker(statusEvery)
	defer tick.Stop()
	var wd <-chan time.Time
	if n.watchdog > 0 {
		t := time.NewTicker(n.watchdog)
		defer t.Stop()
		wd = t.C
	}
	for {
		select {
		case <-ctx.Done():
			report("STOPPING=1", statusLine("stopping: finishing requests in flight and flushing the members (a second signal exits at once)"))
			return
		case <-tick.C:
			if s := status(); s != last {
				last = s
				report(statusLine(s))
			}
		case <-wd:
			report("WATCHDOG=1")
		}
	}
}
