package nbd

import "time"

// The wire constants and header layouts are in nbd/internal/wire, shared with nbd/client.

// metaIDAllocation is the id the server gives the base:allocation metadata context (ids are
// per connection; there is only one context).
const metaIDAllocation = uint32(1)

// Limits of the handshake.
const (
	// maxOptionLength bounds the data of one option. The longest legitimate option is an
	// NBD_OPT_INFO/GO with a 4096-byte name and a handful of information requests; a client
	// that announces more is treated as hostile and disconnected.
	maxOptionLength = 64 << 10
	// maxStringLength is the protocol's limit on export names and other strings.
	maxStringLength = 4096
)

// Block size defaults (Export.MinBlock, PreferredBlock, MaxBlock).
const (
	DefaultMinBlock       = 512
	DefaultPreferredBlock = 4096
	DefaultMaxBlock       = 32 << 20
	// DefaultMaxInFlightBytes bounds the request buffers one connection holds at once.
	DefaultMaxInFlightBytes = 64 << 20
	// DefaultMaxInFlightRequests bounds the requests one connection processes at once.
	DefaultMaxInFlightRequests = 64
)

// Server-wide limit defaults (Options.MaxConnections, MaxTotalInFlightBytes, HandshakeTimeout).
const (
	DefaultMaxConnections        = 128
	DefaultMaxTotalInFlightBytes = 1 << 30
	DefaultHandshakeTimeout      = 10 * time.Second
	// DefaultReplyTimeout bounds one reply write (Options.ReplyTimeout).
	DefaultReplyTimeout = 30 * time.Second
	// DefaultPayloadTimeout bounds the arrival of one WRITE payload (Options.PayloadTimeout).
	DefaultPayloadTimeout = 30 * time.Second
)
