// Package wire is the NBD wire format that raid5d's server (package nbd) and client
// (nbd/client) share: the protocol's constants, named after doc/proto.md of the NBD reference
// implementation without the NBD_ prefix, the fixed headers of the transmission phase, and
// the names of commands and error values. Values that go-nbd's protocol package defines are
// taken from there, and so are the header structs (protocol.TransmissionRequestHeader,
// protocol.TransmissionReplyHeader); the rest are added here. Which of them a side sends or
// accepts is that side's business, not this package's.
package wire

import (
	"encoding/binary"
	"syscall"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Magic numbers and the sizes of fixed headers.
const (
	MagicNBD             = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC", first in every greeting
	MagicOption          = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT": newstyle greeting, each option
	MagicOptionReply     = protocol.NEGOTIATION_MAGIC_REPLY
	MagicOldstyle        = uint64(0x00420281861253) // after NBDMAGIC in an oldstyle greeting
	MagicRequest         = protocol.TRANSMISSION_MAGIC_REQUEST
	MagicSimpleReply     = protocol.TRANSMISSION_MAGIC_REPLY
	MagicStructuredReply = uint32(0x668e33ef)

	RequestHeaderSize = 28 // magic, flags, type, cookie, offset, length
	ReplyHeaderSize   = 16 // magic, error, cookie (simple reply)
	ChunkHeaderSize   = 20 // magic, flags, type, cookie, length (structured reply chunk)
)

// Handshake flags (the server's) and client flags.
const (
	FlagFixedNewstyle  = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	FlagNoZeroes       = uint16(1 << 1)
	FlagCFixedNewstyle = uint32(1 << 0)
	FlagCNoZeroes      = uint32(1 << 1)
)

// Option types.
const (
	OptExportName      = uint32(1)
	OptAbort           = protocol.NEGOTIATION_ID_OPTION_ABORT
	OptList            = protocol.NEGOTIATION_ID_OPTION_LIST
	OptStartTLS        = uint32(5)
	OptInfo            = protocol.NEGOTIATION_ID_OPTION_INFO
	OptGo              = protocol.NEGOTIATION_ID_OPTION_GO
	OptStructuredReply = uint32(8)
	OptListMetaContext = uint32(9)
	OptSetMetaContext  = uint32(10)
	OptExtendedHeaders = uint32(11)
)

// Option reply types. Errors have RepErrBit set.
const (
	RepAck              = protocol.NEGOTIATION_TYPE_REPLY_ACK
	RepServer           = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	RepInfo             = protocol.NEGOTIATION_TYPE_REPLY_INFO
	RepMetaContext      = uint32(4)
	RepErrBit           = uint32(1 << 31)
	RepErrUnsup         = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	RepErrPolicy        = RepErrBit | 2
	RepErrInvalid       = RepErrBit | 3
	RepErrPlatform      = RepErrBit | 4
	RepErrTLSReqd       = RepErrBit | 5
	RepErrUnknown       = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN
	RepErrShutdown      = RepErrBit | 7
	RepErrBlockSizeReqd = RepErrBit | 8
	RepErrTooBig        = RepErrBit | 9
)

// Information types in NBD_REP_INFO replies and NBD_OPT_INFO/GO requests.
const (
	InfoExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	InfoName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	InfoDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	InfoBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE
)

// Transmission flags.
const (
	FlagHasFlags        = protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS
	FlagReadOnly        = uint16(1 << 1)
	FlagSendFlush       = uint16(1 << 2)
	FlagSendFUA         = uint16(1 << 3)
	FlagRotational      = uint16(1 << 4)
	FlagSendTrim        = uint16(1 << 5)
	FlagSendWriteZeroes = uint16(1 << 6)
	FlagSendDF          = uint16(1 << 7)
	FlagCanMultiConn    = protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN
	FlagSendCache       = uint16(1 << 10)
	FlagSendFastZero    = uint16(1 << 11)
)

// Command types.
const (
	CmdRead        = protocol.TRANSMISSION_TYPE_REQUEST_READ
	CmdWrite       = protocol.TRANSMISSION_TYPE_REQUEST_WRITE
	CmdDisc        = protocol.TRANSMISSION_TYPE_REQUEST_DISC
	CmdFlush       = uint16(3)
	CmdTrim        = uint16(4)
	CmdCache       = uint16(5)
	CmdWriteZeroes = uint16(6)
	CmdBlockStatus = uint16(7)
)

// Command flags.
const (
	CmdFlagFUA        = uint16(1 << 0)
	CmdFlagNoHole     = uint16(1 << 1)
	CmdFlagDF         = uint16(1 << 2)
	CmdFlagReqOne     = uint16(1 << 3)
	CmdFlagFastZero   = uint16(1 << 4)
	CmdFlagPayloadLen = uint16(1 << 5)
)

// Structured reply chunk flags and types.
const (
	ReplyFlagDone        = uint16(1 << 0)
	ReplyTypeNone        = uint16(0)
	ReplyTypeOffsetData  = uint16(1)
	ReplyTypeBlockStatus = uint16(5)
	ReplyTypeError       = uint16(1<<15 | 1)
	ReplyTypeErrorOffset = uint16(1<<15 | 2)
)

// The base:allocation metadata context: its name and its extent flags.
const (
	MetaBaseAllocation = "base:allocation"
	StateHole          = uint32(1 << 0)
	StateZero          = uint32(1 << 1)
)

// Error values of replies. The protocol allows only these (Linux errno numbers).
const (
	EPERM     = protocol.TRANSMISSION_ERROR_EPERM
	EIO       = uint32(5)
	ENOMEM    = uint32(12)
	EINVAL    = protocol.TRANSMISSION_ERROR_EINVAL
	ENOSPC    = uint32(28)
	EOVERFLOW = uint32(75)
	ENOTSUP   = uint32(95)
	ESHUTDOWN = uint32(108)
)

// PutRequest encodes a request header into b.
func PutRequest(b *[RequestHeaderSize]byte, flags, typ uint16, cookie, off uint64, length uint32) {
	binary.BigEndian.PutUint32(b[0:4], MagicRequest)
	binary.BigEndian.PutUint16(b[4:6], flags)
	binary.BigEndian.PutUint16(b[6:8], typ)
	binary.BigEndian.PutUint64(b[8:16], cookie)
	binary.BigEndian.PutUint64(b[16:24], off)
	binary.BigEndian.PutUint32(b[24:28], length)
}

// DecodeRequest decodes a request header. It checks nothing, not even the magic.
func DecodeRequest(b *[RequestHeaderSize]byte) protocol.TransmissionRequestHeader {
	return protocol.TransmissionRequestHeader{
		RequestMagic: binary.BigEndian.Uint32(b[0:4]),
		CommandFlags: binary.BigEndian.Uint16(b[4:6]),
		Type:         binary.BigEndian.Uint16(b[6:8]),
		Handle:       binary.BigEndian.Uint64(b[8:16]),
		Offset:       binary.BigEndian.Uint64(b[16:24]),
		Length:       binary.BigEndian.Uint32(b[24:28]),
	}
}

// PutReply encodes a simple reply header into b.
func PutReply(b *[ReplyHeaderSize]byte, errno uint32, cookie uint64) {
	binary.BigEndian.PutUint32(b[0:4], MagicSimpleReply)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], cookie)
}

// DecodeReply decodes a simple reply header. It checks nothing, not even the magic.
func DecodeReply(b *[ReplyHeaderSize]byte) protocol.TransmissionReplyHeader {
	return protocol.TransmissionReplyHeader{
		ReplyMagic: binary.BigEndian.Uint32(b[0:4]),
		Error:      binary.BigEndian.Uint32(b[4:8]),
		Handle:     binary.BigEndian.Uint64(b[8:16]),
	}
}

// PutChunk encodes a structured reply chunk header into b (at least ChunkHeaderSize bytes):
// flags, type, cookie and the length of the payload that follows.
func PutChunk(b []byte, flags, typ uint16, cookie uint64, length uint32) {
	_ = b[ChunkHeaderSize-1]
	binary.BigEndian.PutUint32(b[0:4], MagicStructuredReply)
	binary.BigEndian.PutUint16(b[4:6], flags)
	binary.BigEndian.PutUint16(b[6:8], typ)
	binary.BigEndian.PutUint64(b[8:16], cookie)
	binary.BigEndian.PutUint32(b[16:20], length)
}

// CmdName names a command type ("READ", "WRITE_ZEROES"; "unknown" for others).
func CmdName(t uint16) string {
	switch t {
	case CmdRead:
		return "READ"
	case CmdWrite:
		return "WRITE"
	case CmdDisc:
		return "DISC"
	case CmdFlush:
		return "FLUSH"
	case CmdTrim:
		return "TRIM"
	case CmdCache:
		return "CACHE"
	case CmdWriteZeroes:
		return "WRITE_ZEROES"
	case CmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return "unknown"
}

// errnos are the protocol's error values with their symbols and the words a human reads.
var errnos = [...]struct {
	errno      uint32
	name, text string
}{
	{EPERM, "EPERM", "operation not permitted"},
	{EIO, "EIO", "input/output error"},
	{ENOMEM, "ENOMEM", "out of memory"},
	{EINVAL, "EINVAL", "invalid argument"},
	{ENOSPC, "ENOSPC", "no space left on device"},
	{EOVERFLOW, "EOVERFLOW", "value too large"},
	{ENOTSUP, "ENOTSUP", "operation not supported"},
	{ESHUTDOWN, "ESHUTDOWN", "server shutting down"},
}

// ErrnoName returns an error value's symbol ("EIO"), or for a value the protocol does not
// define, what syscall.Errno says of it.
func ErrnoName(errno uint32) string {
	for _, e := range errnos {
		if e.errno == errno {
			return e.name
		}
	}
	return syscall.Errno(errno).Error()
}

// ErrnoText describes an error value in words ("input/output error"; "error" for a value the
// protocol does not define), for messages a human reads.
func ErrnoText(errno uint32) string {
	for _, e := range errnos {
		if e.errno == errno {
			return e.text
		}
	}
	return "error"
}
