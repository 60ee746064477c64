package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// exportInfo is what the handshake learned about the export.
type exportInfo struct {
	size                          int64
	flags                         uint16
	minBlock, prefBlock, maxBlock uint32
	name                          string // NBD_INFO_NAME: the server's name of the export ("" if none sent)
}

// handshake negotiates export on nc (read through r): greeting, client flags, NBD_OPT_STARTTLS
// and the TLS handshake when tlsConf is set, then NBD_OPT_GO (or NBD_OPT_EXPORT_NAME when GO is
// unsupported or the server is not fixed-newstyle). It returns the connection and reader the
// transmission phase must use: the TLS session after an upgrade, else nc and r.
func handshake(ctx context.Context, r *bufio.Reader, nc net.Conn, export string, tlsConf *tls.Config) (exportInfo, net.Conn, *bufio.Reader, error) {
	var g [18]byte
	if _, err := io.ReadFull(r, g[:]); err != nil {
		return exportInfo{}, nil, nil, fmt.Errorf("client: reading the greeting: %w", err)
	}
	if m := binary.BigEndian.Uint64(g[0:8]); m != wire.MagicNBD {
		return exportInfo{}, nil, nil, fmt.Errorf("%w: greeting magic %#x", ErrHandshake, m)
	}
	if m := binary.BigEndian.Uint64(g[8:16]); m != wire.MagicOption {
		if m == wire.MagicOldstyle {
			return exportInfo{}, nil, nil, fmt.Errorf("%w: oldstyle server (not supported)", ErrHandshake)
		}
		return exportInfo{}, nil, nil, fmt.Errorf("%w: greeting option magic %#x", ErrHandshake, m)
	}
	hflags := binary.BigEndian.Uint16(g[16:18])
	var cflags uint32
	fixed := hflags&wire.FlagFixedNewstyle != 0
	if fixed {
		cflags |= wire.FlagCFixedNewstyle
	}
	noZeroes := hflags&wire.FlagNoZeroes != 0
	if noZeroes {
		cflags |= wire.FlagCNoZeroes
	}
	var w io.Writer = nc
	if err := writeUint32(w, cflags); err != nil {
		return exportInfo{}, nil, nil, err
	}
	if tlsConf != nil {
		if !fixed {
			return exportInfo{}, nil, nil, fmt.Errorf("%w: TLS asked for, but the server is not fixed-newstyle (no NBD_OPT_STARTTLS)", ErrHandshake)
		}
		tc, err := startTLS(ctx, r, nc, tlsConf)
		if err != nil {
			return exportInfo{}, nil, nil, err
		}
		nc, w, r = tc, tc, bufio.NewReaderSize(tc, r.Size())
	}
	if fixed {
		info, ok, err := optionGo(r, w, export)
		if err != nil || ok {
			return info, nc, r, err
		}
	}
	info, err := exportName(r, w, export, noZeroes)
	return info, nc, r, err
}

// startTLS sends NBD_OPT_STARTTLS and, once the server acknowledges it, runs the TLS handshake
// on nc. A server that refuses (TLS off, NBD_REP_ERR_POLICY, or no TLS support at all) gives
// an *OptionError.
func startTLS(ctx context.Context, r *bufio.Reader, nc net.Conn, conf *tls.Config) (*tls.Conn, error) {
	if err := writeOption(nc, wire.OptStartTLS, nil); err != nil {
		return nil, err
	}
	var h [20]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("client: reading NBD_OPT_STARTTLS reply: %w", err)
	}
	if m := binary.BigEndian.Uint64(h[0:8]); m != wire.MagicOptionReply {
		return nil, fmt.Errorf("%w: option reply magic %#x", ErrHandshake, m)
	}
	if o := binary.BigEndian.Uint32(h[8:12]); o != wire.OptStartTLS {
		return nil, fmt.Errorf("%w: reply to option %d, asked %d", ErrHandshake, o, wire.OptStartTLS)
	}
	typ := binary.BigEndian.Uint32(h[12:16])
	n := binary.BigEndian.Uint32(h[16:20])
	if n > maxOptionReply {
		return nil, fmt.Errorf("%w: option reply of %d bytes", ErrHandshake, n)
	}
	d := make([]byte, n)
	if _, err := io.ReadFull(r, d); err != nil {
		return nil, fmt.Errorf("client: reading NBD_OPT_STARTTLS reply: %w", err)
	}
	switch {
	case typ == wire.RepAck && n == 0:
	case typ&wire.RepErrBit != 0:
		return nil, &OptionError{Option: wire.OptStartTLS, Reply: typ, Message: string(d)}
	default:
		return nil, fmt.Errorf("%w: unexpected reply %#x of %d bytes to NBD_OPT_STARTTLS", ErrHandshake, typ, n)
	}
	// The server sends nothing more until our ClientHello: buffered bytes would be an attack
	// on the plaintext part (injected before the upgrade), not a TLS record.
	if r.Buffered() > 0 {
		return nil, fmt.Errorf("%w: %d bytes after the NBD_OPT_STARTTLS acknowledgement", ErrHandshake, r.Buffered())
	}
	tc := tls.Client(nc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTLSHandshake, err)
	}
	return tc, nil
}

func writeUint32(w io.Writer, v uint32) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	_, err := w.Write(b[:])
	return err
}

func writeOption(w io.Writer, opt uint32, data []byte) error {
	b := make([]byte, 16, 16+len(data))
	binary.BigEndian.PutUint64(b[0:8], wire.MagicOption)
	binary.BigEndian.PutUint32(b[8:12], opt)
	binary.BigEndian.PutUint32(b[12:16], uint32(len(data)))
	_, err := w.Write(append(b, data...))
	return err
}

// maxOptionReply bounds the data of one option reply we are willing to read.
const maxOptionReply = 64 << 10

// optionGo sends NBD_OPT_GO asking for the block size. ok is false (with no error) when the
// server answers NBD_REP_ERR_UNSUP, so the caller falls back to NBD_OPT_EXPORT_NAME.
func optionGo(r *bufio.Reader, w io.Writer, export string) (info exportInfo, ok bool, err error) {
	data := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = binary.BigEndian.AppendUint16(data, 2)
	data = binary.BigEndian.AppendUint16(data, wire.InfoBlockSize)
	data = binary.BigEndian.AppendUint16(data, wire.InfoName)
	if err := writeOption(w, wire.OptGo, data); err != nil {
		return info, false, err
	}
	gotExport := false
	for {
		var h [20]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return info, false, fmt.Errorf("client: reading NBD_OPT_GO reply: %w", err)
		}
		if m := binary.BigEndian.Uint64(h[0:8]); m != wire.MagicOptionReply {
			return info, false, fmt.Errorf("%w: option reply magic %#x", ErrHandshake, m)
		}
		if o := binary.BigEndian.Uint32(h[8:12]); o != wire.OptGo {
			return info, false, fmt.Errorf("%w: reply to option %d, asked %d", ErrHandshake, o, wire.OptGo)
		}
		typ := binary.BigEndian.Uint32(h[12:16])
		n := binary.BigEndian.Uint32(h[16:20])
		if n > maxOptionReply {
			return info, false, fmt.Errorf("%w: option reply of %d bytes", ErrHandshake, n)
		}
		d := make([]byte, n)
		if _, err := io.ReadFull(r, d); err != nil {
			return info, false, fmt.Errorf("client: reading NBD_OPT_GO reply: %w", err)
		}
		switch {
		case typ == wire.RepAck:
			if !gotExport {
				return info, false, fmt.Errorf("%w: NBD_OPT_GO acknowledged without NBD_INFO_EXPORT", ErrHandshake)
			}
			if info.maxBlock == 0 {
				info.minBlock, info.prefBlock, info.maxBlock = 1, 4096, defaultMaxBlock
			}
			return info, true, nil
		case typ == wire.RepInfo:
			if len(d) < 2 {
				return info, false, fmt.Errorf("%w: empty NBD_REP_INFO", ErrHandshake)
			}
			switch binary.BigEndian.Uint16(d[0:2]) {
			case wire.InfoExport:
				if len(d) != 12 {
					return info, false, fmt.Errorf("%w: NBD_INFO_EXPORT of %d bytes", ErrHandshake, len(d))
				}
				size := binary.BigEndian.Uint64(d[2:10])
				if size > 1<<63-1 {
					return info, false, fmt.Errorf("%w: export size %d", ErrHandshake, size)
				}
				info.size = int64(size)
				info.flags = binary.BigEndian.Uint16(d[10:12])
				gotExport = true
			case wire.InfoBlockSize:
				if len(d) != 14 {
					return info, false, fmt.Errorf("%w: NBD_INFO_BLOCK_SIZE of %d bytes", ErrHandshake, len(d))
				}
				info.minBlock = binary.BigEndian.Uint32(d[2:6])
				info.prefBlock = binary.BigEndian.Uint32(d[6:10])
				info.maxBlock = binary.BigEndian.Uint32(d[10:14])
				if info.minBlock == 0 || info.maxBlock < info.minBlock {
					return info, false, fmt.Errorf("%w: block sizes min %d max %d", ErrHandshake, info.minBlock, info.maxBlock)
				}
			case wire.InfoName:
				info.name = string(d[2:])
			}
			// Other information (the description) is ignored.
		case typ == wire.RepErrUnsup:
			return info, false, nil
		case typ&wire.RepErrBit != 0:
			return info, false, &OptionError{Option: wire.OptGo, Reply: typ, Message: string(d)}
		default:
			return info, false, fmt.Errorf("%w: unexpected reply %#x to NBD_OPT_GO", ErrHandshake, typ)
		}
	}
}

// exportName sends NBD_OPT_EXPORT_NAME; the server answers with the size and flags, or closes
// the connection if it has no such export.
func exportName(r *bufio.Reader, w io.Writer, export string, noZeroes bool) (exportInfo, error) {
	if err := writeOption(w, wire.OptExportName, []byte(export)); err != nil {
		return exportInfo{}, err
	}
	n := 8 + 2 + 124
	if noZeroes {
		n = 10
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return exportInfo{}, fmt.Errorf("client: NBD_OPT_EXPORT_NAME %q: no answer (is there such an export?): %w", export, err)
	}
	size := binary.BigEndian.Uint64(b[0:8])
	if size > 1<<63-1 {
		return exportInfo{}, fmt.Errorf("%w: export size %d", ErrHandshake, size)
	}
	return exportInfo{
		size: int64(size), flags: binary.BigEndian.Uint16(b[8:10]),
		minBlock: 1, prefBlock: 4096, maxBlock: defaultMaxBlock,
	}, nil
}
