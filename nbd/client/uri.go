package client

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// URI is where an export is: a network ("tcp" or "unix"), an address for net.Dial, and the
// export name.
type URI struct {
	Network string
	Address string
	Export  string
}

// ParseURI reads an NBD URI as the NBD URI specification writes them:
//
//	nbd://host[:port][/export]          TCP, port 10809 by default
//	nbd+unix:///[export]?socket=PATH    unix socket
//
// The export name is the path without its leading slash, percent-decoded; empty means the
// server's default export. TLS schemes (nbds, nbds+unix) and other query parameters are refused
// with ErrBadURI.
func ParseURI(s string) (URI, error) {
	u, err := url.Parse(s)
	if err != nil {
		return URI{}, fmt.Errorf("%w: %q: %v", ErrBadURI, s, err)
	}
	export := strings.TrimPrefix(u.Path, "/")
	q := u.Query()
	switch u.Scheme {
	case "nbd":
		if u.Host == "" {
			return URI{}, fmt.Errorf("%w: %q: no host", ErrBadURI, s)
		}
		if len(q) != 0 {
			return URI{}, fmt.Errorf("%w: %q: unexpected query for nbd://", ErrBadURI, s)
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = DefaultPort
		}
		return URI{Network: "tcp", Address: net.JoinHostPort(host, port), Export: export}, nil
	case "nbd+unix":
		if u.Host != "" {
			return URI{}, fmt.Errorf("%w: %q: nbd+unix takes no host (nbd+unix:///export?socket=PATH)", ErrBadURI, s)
		}
		sock := q.Get("socket")
		if sock == "" || len(q) != 1 || len(q["socket"]) != 1 {
			return URI{}, fmt.Errorf("%w: %q: want exactly one socket=PATH query", ErrBadURI, s)
		}
		return URI{Network: "unix", Address: sock, Export: export}, nil
	case "nbds", "nbds+unix":
		return URI{}, fmt.Errorf("%w: %q: TLS is not supported", ErrBadURI, s)
	}
	return URI{}, fmt.Errorf("%w: %q: scheme must be nbd or nbd+unix", ErrBadURI, s)
}

// String writes u back as an NBD URI.
func (u URI) String() string {
	p := (&url.URL{Path: "/" + u.Export}).EscapedPath()
	if u.Network == "unix" {
		return "nbd+unix://" + p + "?socket=" + url.QueryEscape(u.Address)
	}
	return "nbd://" + u.Address + p
}
