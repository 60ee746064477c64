package nbd

import (
	"encoding/binary"
	"time"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Wire constants, named after doc/proto.md of the NBD reference implementation. Values that
// go-nbd's protocol package defines are taken from there; the rest are added here.

// Magic numbers.
const (
	magicNBD          = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC"
	magicOption       = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT"
	magicOptionReply  = protocol.NEGOTIATION_MAGIC_REPLY
	magicRequest      = protocol.TRANSMISSION_MAGIC_REQUEST
	magicSimpleReply  = protocol.TRANSMISSION_MAGIC_REPLY
	magicStructReply  = uint32(0x668e33ef) // NBD_STRUCTURED_REPLY_MAGIC
	requestHeaderSize = 28                 // magic, flags, type, cookie, offset, length
	replyHeaderSize   = 16                 // magic, error, cookie
	chunkHeaderSize   = 20                 // magic, flags, type, cookie, length (structured reply chunk)
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle   = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	flagNoZeroes        = uint16(1 << 1)
	clientFixedNewstyle = uint32(1 << 0)
	clientNoZeroes      = uint32(1 << 1)
)

// Option types.
const (
	optExportName      = uint32(1)
	optAbort           = protocol.NEGOTIATION_ID_OPTION_ABORT
	optList            = protocol.NEGOTIATION_ID_OPTION_LIST
	optStartTLS        = uint32(5)
	optInfo            = protocol.NEGOTIATION_ID_OPTION_INFO
	optGo              = protocol.NEGOTIATION_ID_OPTION_GO
	optStructuredReply = uint32(8)
	optListMetaContext = uint32(9)
	optSetMetaContext  = uint32(10)
	optExtendedHeaders = uint32(11)
)

// Option reply types. Errors have bit 31 set.
const (
	repAck            = protocol.NEGOTIATION_TYPE_REPLY_ACK
	repServer         = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	repInfo           = protocol.NEGOTIATION_TYPE_REPLY_INFO
	repErrUnsup       = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	repErrPolicy      = uint32(1<<31 | 2)
	repErrInvalid     = uint32(1<<31 | 3)
	repErrPlatform    = uint32(1<<31 | 4)
	repErrTLSReqd     = uint32(1<<31 | 5)
	repErrUnknown     = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN
	repErrShutdown    = uint32(1<<31 | 7)
	repErrBlockSzReqd = uint32(1<<31 | 8)
	repErrTooBig      = uint32(1<<31 | 9)
	repMetaContext    = uint32(4)
)

// Information types in NBD_REP_INFO replies and NBD_OPT_INFO/GO requests.
const (
	infoExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	infoName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	infoDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	infoBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE
)

// Transmission flags.
const (
	tflagHasFlags        = protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS
	tflagReadOnly        = uint16(1 << 1)
	tflagSendFlush       = uint16(1 << 2)
	tflagSendFUA         = uint16(1 << 3)
	tflagRotational      = uint16(1 << 4)
	tflagSendTrim        = uint16(1 << 5)
	tflagSendWriteZeroes = uint16(1 << 6)
	tflagSendDF          = uint16(1 << 7)
	tflagCanMultiConn    = protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN
	tflagSendCache       = uint16(1 << 10)
	tflagSendFastZero    = uint16(1 << 11)
)

// Command types.
const (
	cmdRead        = protocol.TRANSMISSION_TYPE_REQUEST_READ
	cmdWrite       = protocol.TRANSMISSION_TYPE_REQUEST_WRITE
	cmdDisc        = protocol.TRANSMISSION_TYPE_REQUEST_DISC
	cmdFlush       = uint16(3)
	cmdTrim        = uint16(4)
	cmdCache       = uint16(5)
	cmdWriteZeroes = uint16(6)
	cmdBlockStatus = uint16(7)
)

// Structured reply chunk flags and types.
const (
	replyFlagDone        = uint16(1 << 0)
	replyTypeNone        = uint16(0)
	replyTypeOffsetData  = uint16(1)
	replyTypeBlockStatus = uint16(5)
	replyTypeError       = uint16(1<<15 | 1)
	replyTypeErrorOffset = uint16(1<<15 | 2)
)

// The base:allocation metadata context: its name, the id raid5d gives it (ids are per
// connection; there is only one context), and its extent flags.
const (
	metaBaseAllocation = "base:allocation"
	metaIDAllocation   = uint32(1)
	stateHole          = uint32(1 << 0)
	stateZero          = uint32(1 << 1)
)

// Command flags.
const (
	cmdFlagFUA        = uint16(1 << 0)
	cmdFlagNoHole     = uint16(1 << 1)
	cmdFlagDF         = uint16(1 << 2)
	cmdFlagReqOne     = uint16(1 << 3)
	cmdFlagFastZero   = uint16(1 << 4)
	cmdFlagPayloadLen = uint16(1 << 5)
)

// Error values of the simple reply. The protocol allows only these; errnoOf maps everything
// else onto them.
const (
	errnoPerm     = protocol.TRANSMISSION_ERROR_EPERM
	errnoIO       = uint32(5)
	errnoNoMem    = uint32(12)
	errnoInval    = protocol.TRANSMISSION_ERROR_EINVAL
	errnoNoSpace  = uint32(28)
	errnoOverflow = uint32(75)
	errnoNotSup   = uint32(95)
	errnoShutdown = uint32(108)
)

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

// decodeRequest decodes a request header. It checks nothing; see conn.check.
func decodeRequest(b *[requestHeaderSize]byte) protocol.TransmissionRequestHeader {
	return protocol.TransmissionRequestHeader{
		RequestMagic: binary.BigEndian.Uint32(b[0:4]),
		CommandFlags: binary.BigEndian.Uint16(b[4:6]),
		Type:         binary.BigEndian.Uint16(b[6:8]),
		Handle:       binary.BigEndian.Uint64(b[8:16]),
		Offset:       binary.BigEndian.Uint64(b[16:24]),
		Length:       binary.BigEndian.Uint32(b[24:28]),
	}
}

// encodeChunk encodes a structured reply chunk header into b: flags, type, cookie and the
// length of the payload that follows.
func encodeChunk(b []byte, flags, typ uint16, cookie uint64, length uint32) {
	binary.BigEndian.PutUint32(b[0:4], magicStructReply)
	binary.BigEndian.PutUint16(b[4:6], flags)
	binary.BigEndian.PutUint16(b[6:8], typ)
	binary.BigEndian.PutUint64(b[8:16], cookie)
	binary.BigEndian.PutUint32(b[16:20], length)
}

// encodeReply encodes a simple reply header into b.
func encodeReply(b *[replyHeaderSize]byte, errno uint32, cookie uint64) {
	binary.BigEndian.PutUint32(b[0:4], magicSimpleReply)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], cookie)
}

// errnoText names an error value in structured error messages a human reads.
func errnoText(errno uint32) string {
	switch errno {
	case errnoPerm:
		return "operation not permitted"
	case errnoIO:
		return "input/output error"
	case errnoNoMem:
		return "out of memory"
	case errnoInval:
		return "invalid argument"
	case errnoNoSpace:
		return "no space left on device"
	case errnoOverflow:
		return "value too large"
	case errnoNotSup:
		return "operation not supported"
	case errnoShutdown:
		return "server shutting down"
	}
	return "error"
}

// cmdName names a command type for log lines.
func cmdName(t uint16) string {
	switch t {
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
	case cmdCache:
		return "CACHE"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	case cmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return "unknown"
}
