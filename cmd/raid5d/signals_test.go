package main

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestWatchSignals: the first signal cancels (and logs that a second one forces an exit), the
// second calls exit with 128+signal after its ERROR line; closing done ends the watch at
// either stage without exiting.
func TestWatchSignals(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	logged := func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }

	sigs, done := make(chan os.Signal, 2), make(chan struct{})
	canceled, exited := make(chan struct{}), make(chan int, 1)
	go watchSignals(sigs, done, func() { close(canceled) }, log, func(code int) { exited <- code })
	sigs <- syscall.SIGTERM
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the first signal did not cancel")
	}
	sigs <- syscall.SIGINT
	select {
	case code := <-exited:
		if code != 130 {
			t.Fatalf("exit status after a second SIGINT: %d, want 130", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not exit")
	}
	out := logged()
	if !strings.Contains(out, "a second SIGINT or SIGTERM exits at once") ||
		!strings.Contains(out, "level=ERROR msg=\""+secondSignalMessage) {
		t.Fatalf("log:\n%s", out)
	}

	for _, signals := range []int{0, 1} {
		sigs, done := make(chan os.Signal, 2), make(chan struct{})
		returned := make(chan struct{})
		go func() {
			watchSignals(sigs, done, func() {}, log, func(code int) { t.Errorf("exit(%d) without a second signal", code) })
			close(returned)
		}()
		for range signals {
			sigs <- syscall.SIGTERM
		}
		close(done)
		select {
		case <-returned:
		case <-time.After(10 * time.Second):
			t.Fatalf("watchSignals did not return when done closed after %d signals", signals)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
