package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// secondSignalMessage is the ERROR line a second SIGINT or SIGTERM logs before the process exits.
const secondSignalMessage = "second signal: exiting now without flushing; the array is left dirty and will be resynced at the next start"

// exitLogWait bounds how long the exit on a second signal waits for its log line to be written
// (a stderr pipe nobody reads cannot keep the process alive).
const exitLogWait = time.Second

// stopOnSignal returns a context that the first SIGINT or SIGTERM cancels: serve then drains,
// writes out the stripe cache, flushes the members and marks the array clean, which a hung
// member or device can make take for ever. A second SIGINT or SIGTERM therefore ends the
// process at once with exit status 128+signal (130 for SIGINT, 143 for SIGTERM), without
// touching the array: no Close, no flush, nothing waited for; the superblocks still say dirty,
// so the next assembly resyncs as after a crash. stop ends the watch (call it when serve is
// done); it returns once the watching goroutine has.
func stopOnSignal(log *slog.Logger) (ctx context.Context, stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { watchSignals(sigs, done, cancel, log, os.Exit) })
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
		cancel()
	}
}

// watchSignals cancels on the first signal from sigs and calls exit(128+signal) on the second,
// after logging secondSignalMessage (waiting at most exitLogWait for the log to take it). It
// returns when done is closed.
func watchSignals(sigs <-chan os.Signal, done <-chan struct{}, cancel func(), log *slog.Logger, exit func(int)) {
	select {
	case sig := <-sigs:
		log.Info("stopping: finishing requests in flight, writing out the stripe cache, flushing the members and marking the array clean; "+
			"a second SIGINT or SIGTERM exits at once and leaves the array dirty", "signal", sig.String())
		cancel()
	case <-done:
		return
	}
	select {
	case sig := <-sigs:
		code := 1
		if s, ok := sig.(syscall.Signal); ok {
			code = 128 + int(s)
		}
		logged := make(chan struct{})
		go func() {
			log.Error(secondSignalMessage, "signal", sig.String(), "exit_status", code)
			close(logged)
		}()
		select {
		case <-logged:
		case <-time.After(exitLogWait):
		}
		exit(code)
	case <-done:
	}
}
