// Command gonbd serves one file over NBD with go-nbd's own server and file backend, unchanged:
// the go-nbd peer of test/bench/peers.sh. It is a benchmark fixture, not part of raid5d.
//
//	gonbd -listen 127.0.0.1:10911 FILE
//
// It serves until SIGINT or SIGTERM, then closes the listener and every connection and waits
// for their handlers.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/pojntfx/go-nbd/pkg/backend"
	"github.com/pojntfx/go-nbd/pkg/server"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gonbd:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:10809", "TCP address to listen on")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: gonbd [-listen ADDR] FILE  (go-nbd v0.3.2 server + file backend)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		return errors.New("need exactly one FILE")
	}
	f, err := os.OpenFile(flag.Arg(0), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	export := &server.Export{Name: "", Backend: backend.NewFileBackend(f)}
	opts := &server.Options{SupportsMultiConn: true}

	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	wg.Go(func() {
		select {
		case <-sig:
		case <-done:
		}
		ln.Close()
	})
	var acceptErr error
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				acceptErr = err
			}
			break
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			// A client that disconnects ends Handle with an error; that is the normal end.
			_ = server.Handle(c, []*server.Export{export}, opts)
			c.Close()
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		})
	}
	close(done)
	mu.Lock()
	for c := range conns {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	return acceptErr
}
