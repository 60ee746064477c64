package client

import (
	"fmt"
	"net"
	"net/url"
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
		if port == "" {
			port = DefaultPort
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
	return s + "://" + u.Address + p
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
