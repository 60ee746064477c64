package client

// Wire constants, named after doc/proto.md of the NBD reference implementation.
const (
	magicNBD         = uint64(0x4e42444d41474943) // "NBDMAGIC"
	magicOption      = uint64(0x49484156454f5054) // "IHAVEOPT"
	magicOptionReply = uint64(0x0003e889045565a9)
	magicOldstyle    = uint64(0x00420281861253)
	magicRequest     = uint32(0x25609513)
	magicSimpleReply = uint32(0x67446698)
	magicStructReply = uint32(0x668e33ef)

	requestHeaderSize = 28
	replyHeaderSize   = 16
)

// Handshake flags.
const (
	flagFixedNewstyle   = uint16(1 << 0)
	flagNoZeroes        = uint16(1 << 1)
	clientFixedNewstyle = uint32(1 << 0)
	clientNoZeroes      = uint32(1 << 1)
)

// Options and replies.
const (
	optExportName = uint32(1)
	optAbort      = uint32(2)
	optStartTLS   = uint32(5)
	optGo         = uint32(7)

	repAck              = uint32(1)
	repInfo             = uint32(3)
	repErrBit           = uint32(1 << 31)
	repErrUnsup         = repErrBit | 1
	repErrPolicy        = repErrBit | 2
	repErrInvalid       = repErrBit | 3
	repErrPlatform      = repErrBit | 4
	repErrTLSReqd       = repErrBit | 5
	repErrUnknown       = repErrBit | 6
	repErrShutdown      = repErrBit | 7
	repErrBlockSizeReqd = repErrBit | 8
	repErrTooBig        = repErrBit | 9

	infoExport    = uint16(0)
	infoBlockSize = uint16(3)
)

// Transmission flags, as Conn.Flags reports them.
const (
	FlagHasFlags        = uint16(1 << 0)
	FlagReadOnly        = uint16(1 << 1)
	FlagSendFlush       = uint16(1 << 2)
	FlagSendFUA         = uint16(1 << 3)
	FlagRotational      = uint16(1 << 4)
	FlagSendTrim        = uint16(1 << 5)
	FlagSendWriteZeroes = uint16(1 << 6)
	FlagCanMultiConn    = uint16(1 << 8)
)

// Commands and command flags.
const (
	cmdRead        = uint16(0)
	cmdWrite       = uint16(1)
	cmdDisc        = uint16(2)
	cmdFlush       = uint16(3)
	cmdTrim        = uint16(4)
	cmdWriteZeroes = uint16(6)

	cmdFlagFUA    = uint16(1 << 0)
	cmdFlagNoHole = uint16(1 << 1)
)

func cmdName(c uint16) string {
	switch c {
	case cmdRead:
		return "READ"
	case cmdWrite:
		return "WRITE"
	case cmdDisc:
		return "DISC"
	case cmdFlush:
		return "FLUSH"
	case cmdTrim:
		return "TRIM"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	}
	return "unknown"
}

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
