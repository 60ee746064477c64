package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeNotifySocket listens on a unixgram socket as systemd does for NOTIFY_SOCKET and hands
// every datagram to the returned channel.
func fakeNotifySocket(t *testing.T, name string) <-chan string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 100)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(msgs)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	})
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return msgs
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// next waits (generously) for the next datagram.
func next(t *testing.T, msgs <-chan string) string {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no sd_notify message")
	}
	return ""
}

func TestNotifierPathAndAbstract(t *testing.T) {
	for _, name := range []string{
		filepath.Join(t.TempDir(), "notify"),
		fmt.Sprintf("@raid5d-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
	} {
		msgs := fakeNotifySocket(t, name)
		n, err := newNotifier(env(map[string]string{"NOTIFY_SOCKET": name}), 1)
		if err != nil || n == nil {
			t.Fatalf("%s: newNotifier: %v, %v", name, n, err)
		}
		if err := n.send("READY=1", statusLine("two\nlines")); err != nil {
			t.Fatal(err)
		}
		if got := next(t, msgs); got != "READY=1\nSTATUS=two lines\n" {
			t.Errorf("%s: got %q", name, got)
		}
		n.Close()
	}
}

func TestNotifierEnvironment(t *testing.T) {
	// No service manager: a nil notifier, every method a no-op.
	n, err := newNotifier(env(nil), 1)
	if err != nil || n != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v, %v", n, err)
	}
	if err := n.send("READY=1"); err != nil {
		t.Error(err)
	}
	n.notifyLoop(context.Background(), func() string { return "" }, time.Second, slog.New(slog.DiscardHandler))
	if _, err := newNotifier(env(map[string]string{"NOTIFY_SOCKET": "relative/path"}), 1); err == nil {
		t.Error("a relative NOTIFY_SOCKET was accepted")
	}

	sock := filepath.Join(t.TempDir(), "notify")
	fakeNotifySocket(t, sock)
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"4000000", "", 2 * time.Second},
		{"4000000", "42", 2 * time.Second},
		{"4000000", "43", 0}, // the watchdog is another process's
		{"nonsense", "", 0},
	} {
		n, err := newNotifier(env(map[string]string{"NOTIFY_SOCKET": sock, "WATCHDOG_USEC": tc.usec, "WATCHDOG_PID": tc.pid}), 42)
		if err != nil {
			t.Fatal(err)
		}
		if n.watchdog != tc.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: watchdog %v, want %v", tc.usec, tc.pid, n.watchdog, tc.want)
		}
		n.Close()
	}
}

// TestNotifyLoop: READY=1 with the status first, a STATUS= line when the status changes (and
// only then), WATCHDOG=1 pings, STOPPING=1 when the context ends.
func TestNotifyLoop(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	msgs := fakeNotifySocket(t, sock)
	n, err := newNotifier(env(map[string]string{"NOTIFY_SOCKET": sock, "WATCHDOG_USEC": "20000"}), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var state atomic.Value
	state.Store("state clean")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		n.notifyLoop(ctx, func() string { return state.Load().(string) }, 5*time.Millisecond, slog.New(slog.DiscardHandler))
	})
	if got := next(t, msgs); got != "READY=1\nSTATUS=state clean\n" {
		t.Fatalf("first message %q, want READY=1 and the status", got)
	}
	// Watchdog pings arrive while the status stays the same; no repeated STATUS.
	for range 3 {
		if got := next(t, msgs); got != "WATCHDOG=1\n" {
			t.Fatalf("got %q, want WATCHDOG=1 (an unchanged status must not be resent)", got)
		}
	}
	state.Store("state degraded, rebuild 12%")
	for {
		got := next(t, msgs)
		if got == "WATCHDOG=1\n" {
			continue
		}
		if got != "STATUS=state degraded, rebuild 12%\n" {
			t.Fatalf("after a change: %q", got)
		}
		break
	}
	cancel()
	wg.Wait()
	for {
		got := next(t, msgs)
		if got == "WATCHDOG=1\n" {
			continue
		}
		if !strings.HasPrefix(got, "STOPPING=1\nSTATUS=stopping") {
			t.Fatalf("at the end: %q, want STOPPING=1", got)
		}
		break
	}
}
