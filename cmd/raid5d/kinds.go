package main

import (
	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member/faulty"
)

// The kinds of member the daemon opens besides plain paths (raid/member # Kinds): a kind is
// registered here, and raid knows none of them. faulty:PATH?... and volatile:PATH are the
// testing aids of raid/member/faulty (the e2e tests' fault and power-cut specs); they take no
// flags, so they are registered before main runs, for the command's own tests too. A kind
// that takes flags (TLS files, a timeout) is registered from main once they are parsed.
func init() { faulty.Register(raid.DataOffset) }
