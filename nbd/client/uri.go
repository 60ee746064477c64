package client

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// URI is where an export is: a network ("tcp" or "unix"), an address for net.Dial, the export
// name, and whether the connection must be upgraded to TLS (the nbds schemes).
type URI struct {
	Network string
	Address string
	Export  string
	TLS     bool
}

// ParseURI reads an NBD URI as the NBD URI specification writes them:
//
//	nbd://host[:port][/export]          TCP, port 10809 by default
//	nbd+unix:///[export]?socket=PATH    unix socket
//	nbds://...  nbds+unix://...         the same, upgraded to TLS with NBD_OPT_STARTTLS
//
// The export name is the path without its leading slash, percent-decoded; empty means the
// server's default export. Query parameters other than socket (libnbd's tls-certificates and
// friends) are refused with ErrBadURI: the TLS files come from Options.TLSConfig instead.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil {
		return URI{}, fmt.Errorf("%w: %q: %v", ErrBadURI, s, err)
	}
	export := strings.TrimPrefix(u.Path, "/")
	q := u.Query()
	scheme, withTLS := u.Scheme, false
	switch u.Scheme {
	case "nbds":
		scheme, withTLS = "nbd", true
	case "nbds+unix":
		scheme, withTLS = "nbd+unix", true
	}
	switch scheme {
	case "nbd":
		if u.Host == "" {
			return URI{}, fmt.Errorf("%w: %q: no host", ErrBadURI, s)
		}
		if len(q) != 0 {
			return URI{}, fmt.Errorf("%w: %q: unexpected query for %s://", ErrBadURI, s, u.Scheme)
		}
		host, port := u.Hostname(), u.Port()
		if err := checkHost(host, strings.HasPrefix(u.Host, "[")); err != nil {
			return URI{}, fmt.Errorf("%w: %q: %v", ErrBadURI, s, err)
		}
		if port == "" {
			port = DefaultPort
		} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return URI{}, fmt.Errorf("%w: %q: port %q is not a number from 1 to 65535", ErrBadURI, s, port)
		}
		return URI{Network: "tcp", Address: net.JoinHostPort(host, port), Export: export, TLS: withTLS}, nil
	case "nbd+unix":
		if u.Host != "" {
			return URI{}, fmt.Errorf("%w: %q: %s takes no host (%s:///export?socket=PATH)", ErrBadURI, s, u.Scheme, u.Scheme)
		}
		sock := q.Get("socket")
		if sock == "" || len(q) != 1 || len(q["socket"]) != 1 {
			return URI{}, fmt.Errorf("%w: %q: want exactly one socket=PATH query", ErrBadURI, s)
		}
		return URI{Network: "unix", Address: sock, Export: export, TLS: withTLS}, nil
	}
	return URI{}, fmt.Errorf("%w: %q: scheme must be nbd, nbd+unix, nbds or nbds+unix", ErrBadURI, s)
}

// checkHost accepts a host name made of letters, digits, '-', '_' and '.', or an IP address;
// an IPv6 address (anything with a colon) only in brackets, as URIs write it.
func checkHost(host string, bracketed bool) error {
	if host == "" {
		return errors.New("no host")
	}
	if bracketed || strings.Contains(host, ":") {
		if a, err := netip.ParseAddr(host); err != nil || !bracketed || !a.Is6() {
			return fmt.Errorf("host %q is not an IPv6 address in brackets", host)
		}
		return nil
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("host %q has a character %q that no host name has", host, c)
		}
	}
	return nil
}

// String writes u back as an NBD URI.
func (u URI) String() string {
	p := (&url.URL{Path: "/" + u.Export}).EscapedPath()
	s := "nbd"
	if u.TLS {
		s = "nbds"
	}
	if u.Network == "unix" {
		return s + "+unix://" + p + "?socket=" + url.QueryEscape(u.Address)
	}
	addr := u.Address
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.Contains(host, "%") {
		addr = "[" + strings.Replace(host, "%", "%25", 1) + "]:" + port // a zone, escaped as URIs write it
	}
	return s + "://" + addr + p
}

// serverName is the name a TLS client checks the server certificate against when the
// configuration names none: the URI's host, or "localhost" for a unix socket.
func (u URI) serverName() string {
	if u.Network == "unix" {
		return "localhost"
	}
	host, _, err := net.SplitHostPort(u.Address)
	if err != nil {
		return u.Address
	}
	return host
}
