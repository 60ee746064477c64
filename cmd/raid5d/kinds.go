package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member/faulty"
	"github.com/raid5d/raid5d/raid/member/nbdmember"
)

// The kinds of member the daemon opens besides plain paths (raid/member # Kinds): a kind is
// registered here, and raid knows none of them. faulty:PATH?... and volatile:PATH are the
// testing aids of raid/member/faulty (the e2e tests' fault and power-cut specs); they take no
// flags. NBD exports (nbd://, nbds://, nbd+unix://, nbds+unix://: raid/member/nbdmember) take
// the flags of memberFlags, which the commands that open members set once they are parsed
// (remoteOpts); all are registered before main runs, for the command's own tests too.
func init() {
	faulty.Register(raid.DataOffset)
	nbdmember.Register(func() nbdmember.Options {
		remoteOpts.mu.Lock()
		defer remoteOpts.mu.Unlock()
		return remoteOpts.o
	})
}

// remoteOpts are the options of the remote members the running command opens.
var remoteOpts struct {
	mu sync.Mutex // guards o
	o  nbdmember.Options
}

// memberFlags adds the remote members' TLS flags to fs; the function it returns, called once
// fs is parsed, makes them and timeout (the array's member timeout: a request's deadline)
// the options of the remote members opened from then on.
func memberFlags(fs *flag.FlagSet) func(timeout time.Duration) {
	ca := fs.String("member-tls-ca", "", "CA certificates `file` (PEM) that sign the certificates of nbds:// members' servers\n"+
		"(default: the system's); an nbds URI's tls-certificates=DIR query key wins")
	cert := fs.String("member-tls-cert", "", "client certificate `file` (PEM) for nbds:// members whose servers ask for one")
	key := fs.String("member-tls-key", "", "private key `file` (PEM) of --member-tls-cert")
	return func(timeout time.Duration) {
		remoteOpts.mu.Lock()
		defer remoteOpts.mu.Unlock()
		remoteOpts.o = nbdmember.Options{TLSCA: *ca, TLSCert: *cert, TLSKey: *key, Timeout: timeout}
	}
}

// serveMemberFlags adds serve's remote member flags to fs: memberFlags' and --member-conns.
// The function it returns, called once fs is parsed, makes them, timeout and log (the
// daemon's logger) the options of the remote members opened from then on.
func serveMemberFlags(fs *flag.FlagSet) func(timeout time.Duration, log *slog.Logger) {
	set := memberFlags(fs)
	conns := rangeFlag{n: nbdmember.DefaultConns, lo: 1, hi: nbdmember.MaxConns}
	fs.Var(&conns, "member-conns", "connections to each remote member whose server advertises CAN_MULTI_CONN (`n`, 1 to 16;\n"+
		"one to the others); requests go to the least busy, FLUSH to every one")
	return func(timeout time.Duration, log *slog.Logger) {
		set(timeout)
		remoteOpts.mu.Lock()
		defer remoteOpts.mu.Unlock()
		remoteOpts.o.Conns, remoteOpts.o.Logger = conns.n, log
	}
}

// rangeFlag is an integer flag that takes lo to hi and nothing else (--member-conns,
// --max-in-flight): a usage error names the range.
type rangeFlag struct{ n, lo, hi int }

func (c *rangeFlag) String() string { return strconv.Itoa(c.n) }
func (c *rangeFlag) Get() any       { return c.n }
func (c *rangeFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < c.lo || n > c.hi {
		return fmt.Errorf("want %d to %d", c.lo, c.hi)
	}
	c.n = n
	return nil
}
