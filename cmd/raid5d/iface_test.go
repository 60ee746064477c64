package main

import (
	"github.com/pojntfx/go-nbd/pkg/backend"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
)

// The array is what the NBD layers serve (device.go wraps it for the server); raid itself does
// not import nbd.
var (
	_ backend.Backend  = (*raid.Array)(nil)
	_ nbd.Device       = (*raid.Array)(nil)
	_ nbd.FUAWriter    = (*raid.Array)(nil)
	_ nbd.PinnedWriter = (*raid.Array)(nil)
)
