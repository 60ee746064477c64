package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
)

// startPprof serves Go's profiling endpoints on addr, which must be a loopback address: the
// profiles reveal memory contents and are not for the network. The server lives as long as the
// process.
func startPprof(addr string, log *slog.Logger) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: --pprof %q: %v", errUsage, addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%w: --pprof %q: only a loopback address is allowed", errUsage, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Info("pprof listening", "address", ln.Addr().String(),
		"profile", "go tool pprof http://"+ln.Addr().String()+"/debug/pprof/profile?seconds=10")
	go http.Serve(ln, mux)
	return nil
}
