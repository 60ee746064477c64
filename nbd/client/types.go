package client

import "github.com/raid5d/raid5d/nbd/internal/wire"

// The wire constants and header layouts are in nbd/internal/wire, shared with the server.

// Transmission flags, as Conn.Flags reports them.
const (
	FlagHasFlags        = wire.FlagHasFlags
	FlagReadOnly        = wire.FlagReadOnly
	FlagSendFlush       = wire.FlagSendFlush
	FlagSendFUA         = wire.FlagSendFUA
	FlagRotational      = wire.FlagRotational
	FlagSendTrim        = wire.FlagSendTrim
	FlagSendWriteZeroes = wire.FlagSendWriteZeroes
	FlagCanMultiConn    = wire.FlagCanMultiConn
)

// Defaults.
const (
	// DefaultPort is the IANA port for NBD over TCP.
	DefaultPort = "10809"
	// DefaultMaxInFlight is Options.MaxInFlight when zero.
	DefaultMaxInFlight = 128
	// defaultMaxBlock is the protocol's suggested payload limit when the server sends no
	// NBD_INFO_BLOCK_SIZE.
	defaultMaxBlock = 32 << 20
)
