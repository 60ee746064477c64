package nbd

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/pojntfx/go-nbd/pkg/protocol"
	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// session is what the handshake agreed on: the export and what the client was told about it.
type session struct {
	export *Export
	size   uint64 // Device.Size, read once when the client chose the export
	flags  uint16 // transmission flags sent to the client
	// structured: NBD_OPT_STRUCTURED_REPLY was acknowledged, so every reply is a structured
	// reply. metaAlloc: base:allocation was selected (NBD_OPT_SET_META_CONTEXT) for this
	// export, so NBD_CMD_BLOCK_STATUS is served.
	structured, metaAlloc bool
}

// handshakeConn is the handshake's view of a connection: where options come from and
// replies go, and who the client is.
type handshakeConn struct {
	r    *bufio.Reader
	w    io.Writer
	log  *slog.Logger
	peer peer
	// upgrade runs the TLS handshake once NBD_REP_ACK to NBD_OPT_STARTTLS has been sent, and
	// replaces r and w and fills in peer. Only called when the server has TLS.
	upgrade func(h *handshakeConn) error

	// What option haggling has agreed on so far; STARTTLS forgets both, as the protocol
	// says. structured: NBD_OPT_STRUCTURED_REPLY acknowledged. metaExport: the export for
	// which the last NBD_OPT_SET_META_CONTEXT selected base:allocation, or nil.
	structured bool
	metaExport *Export
}

// handshake runs the fixed-newstyle handshake on h: greeting, client flags, then options
// until NBD_OPT_EXPORT_NAME or a successful NBD_OPT_GO. It returns the session, or an error
// when the connection must close: errClientAbort after NBD_OPT_ABORT (acknowledged), a protocol
// violation (ErrClientFlags, ErrBadOptionMagic, ErrOptionTooLong, ErrUnknownExport), a refusal
// that NBD_OPT_EXPORT_NAME cannot report (ErrTLSRequired, ErrAccessDenied), a failed TLS
// handshake (ErrTLSHandshake), or an I/O error. Each reply goes out in one Write.
func (s *Server) handshake(h *handshakeConn) (*session, error) {
	var out bytes.Buffer
	binary.Write(&out, binary.BigEndian, protocol.NegotiationNewstyleHeader{
		OldstyleMagic:  wire.MagicNBD,
		OptionMagic:    wire.MagicOption,
		HandshakeFlags: wire.FlagFixedNewstyle | wire.FlagNoZeroes,
	})
	if _, err := h.w.Write(out.Bytes()); err != nil {
		return nil, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(h.r, cf[:]); err != nil {
		return nil, err
	}
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&^(wire.FlagCFixedNewstyle|wire.FlagCNoZeroes) != 0 {
		return nil, fmt.Errorf("%w: %#x", ErrClientFlags, clientFlags)
	}
	noZeroes := clientFlags&wire.FlagCNoZeroes != 0
	// A client without NBD_FLAG_C_FIXED_NEWSTYLE gets fixed newstyle anyway (the protocol
	// allows it); such a client sends only NBD_OPT_EXPORT_NAME, which is answered the same.

	var data []byte // option data, reused; never more than maxOptionLength
	for {
		var oh [16]byte
		if _, err := io.ReadFull(h.r, oh[:]); err != nil {
			return nil, err
		}
		opt := protocol.NegotiationOptionHeader{
			OptionMagic: binary.BigEndian.Uint64(oh[0:8]),
			ID:          binary.BigEndian.Uint32(oh[8:12]),
			Length:      binary.BigEndian.Uint32(oh[12:16]),
		}
		if opt.OptionMagic != wire.MagicOption {
			return nil, fmt.Errorf("%w: %#x", ErrBadOptionMagic, opt.OptionMagic)
		}
		if opt.Length > maxOptionLength {
			return nil, fmt.Errorf("%w: option %d announces %d bytes (limit %d)",
				ErrOptionTooLong, opt.ID, opt.Length, maxOptionLength)
		}
		if cap(data) < int(opt.Length) {
			data = make([]byte, opt.Length)
		}
		data = data[:opt.Length]
		if _, err := io.ReadFull(h.r, data); err != nil {
			return nil, err
		}
		h.log.Debug("nbd: option", "option", opt.ID, "length", opt.Length)

		out.Reset()
		if s.tlsMode == TLSRequire && !h.peer.tls && opt.ID != wire.OptStartTLS && opt.ID != wire.OptAbort {
			// FORCEDTLS: nothing but STARTTLS and ABORT before the upgrade.
			if opt.ID == wire.OptExportName {
				return nil, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS", ErrTLSRequired)
			}
			appendOptionError(&out, opt.ID, wire.RepErrTLSReqd, "TLS is required: send NBD_OPT_STARTTLS first")
			if _, err := h.w.Write(out.Bytes()); err != nil {
				return nil, err
			}
			continue
		}
		switch opt.ID {
		case wire.OptExportName:
			sess, err := s.exportName(&out, h, string(data), noZeroes)
			if err != nil {
				return nil, err
			}
			_, err = h.w.Write(out.Bytes())
			return sess, err

		case wire.OptAbort:
			// Data, if any, is ignored as the protocol asks. The client may already be gone,
			// so a failed write of the ACK changes nothing.
			appendOptionReply(&out, opt.ID, wire.RepAck, nil)
			h.w.Write(out.Bytes())
			return nil, errClientAbort

		case wire.OptList:
			if len(data) != 0 {
				appendOptionError(&out, opt.ID, wire.RepErrInvalid, "NBD_OPT_LIST takes no data")
				break
			}
			for i := range s.exports {
				e := &s.exports[i]
				if !e.allowed(&h.peer) {
					continue // the protocol lets a server omit what the client may not use
				}
				d := binary.BigEndian.AppendUint32(nil, uint32(len(e.Name)))
				d = append(d, e.Name...)
				d = append(d, e.Description...)
				appendOptionReply(&out, opt.ID, wire.RepServer, d)
			}
			appendOptionReply(&out, opt.ID, wire.RepAck, nil)

		case wire.OptInfo, wire.OptGo:
			sess := s.infoOrGo(&out, h, opt.ID, data)
			if _, err := h.w.Write(out.Bytes()); err != nil {
				return nil, err
			}
			if sess != nil && opt.ID == wire.OptGo {
				return sess, nil
			}
			continue

		case wire.OptStartTLS:
			switch {
			case s.tlsMode == TLSOff:
				appendOptionError(&out, opt.ID, wire.RepErrUnsup, "TLS is not enabled on this server")
			case h.peer.tls:
				appendOptionError(&out, opt.ID, wire.RepErrInvalid, "TLS is already on")
			case len(data) != 0:
				appendOptionError(&out, opt.ID, wire.RepErrInvalid, "NBD_OPT_STARTTLS takes no data")
			default:
				appendOptionReply(&out, opt.ID, wire.RepAck, nil)
				if _, err := h.w.Write(out.Bytes()); err != nil {
					return nil, err
				}
				if err := h.upgrade(h); err != nil {
					return nil, err
				}
				h.structured, h.metaExport = false, nil // to be negotiated again under TLS
				h.log.Debug("nbd: TLS on", "peer", h.peer.String())
				continue
			}
		case wire.OptStructuredReply:
			if len(data) != 0 {
				appendOptionError(&out, opt.ID, wire.RepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
				break
			}
			// Extended headers are refused (ERR_UNSUP), so the protocol's rules on mixing
			// them with structured replies never apply. A repeated STRUCTURED_REPLY is
			// acknowledged again: it changes nothing.
			h.structured = true
			appendOptionReply(&out, opt.ID, wire.RepAck, nil)
		case wire.OptListMetaContext, wire.OptSetMetaContext:
			s.metaContext(&out, h, opt.ID, data)
		case wire.OptExtendedHeaders:
			appendOptionError(&out, opt.ID, wire.RepErrUnsup, "extended headers are not supported by this server")
		default:
			appendOptionError(&out, opt.ID, wire.RepErrUnsup, fmt.Sprintf("unknown option %d", opt.ID))
		}
		if _, err := h.w.Write(out.Bytes()); err != nil {
			return nil, err
		}
	}
}

// admit checks h's client against export e. It returns 0 if the client may use it, else the
// option error to answer: NBD_REP_ERR_TLS_REQD when a certificate would be needed and TLS is
// still off, NBD_REP_ERR_POLICY otherwise. A refusal is logged.
func (s *Server) admit(h *handshakeConn, e *Export) uint32 {
	if e.allowed(&h.peer) {
		return 0
	}
	h.log.Warn("nbd: access to export denied", "export", e.Name, "peer", h.peer.String())
	if !h.peer.tls && s.tlsMode != TLSOff && len(e.AllowedClients) > 0 {
		return wire.RepErrTLSReqd
	}
	return wire.RepErrPolicy
}

// exportName answers NBD_OPT_EXPORT_NAME into out. An unknown export cannot be refused
// politely: it returns ErrUnknownExport and the connection closes; so does a client that may
// not use the export (ErrAccessDenied).
func (s *Server) exportName(out *bytes.Buffer, h *handshakeConn, name string, noZeroes bool) (*session, error) {
	e := s.lookup(name)
	if e == nil {
		return nil, fmt.Errorf("%w: %q (NBD_OPT_EXPORT_NAME)", ErrUnknownExport, name)
	}
	if s.admit(h, e) != 0 {
		return nil, fmt.Errorf("%w: export %q, %s (NBD_OPT_EXPORT_NAME)", ErrAccessDenied, e.Name, h.peer.String())
	}
	sess, err := newSession(e, h)
	if err != nil {
		return nil, err
	}
	var b [8 + 2 + 124]byte
	binary.BigEndian.PutUint64(b[0:8], sess.size)
	binary.BigEndian.PutUint16(b[8:10], sess.flags)
	if noZeroes {
		out.Write(b[:10])
	} else {
		out.Write(b[:])
	}
	return sess, nil
}

// newSession describes export e as h's negotiation so far leaves it: structured replies (with
// NBD_FLAG_SEND_DF, since a READ is always answered with one chunk) and base:allocation if
// it was selected for e itself.
func newSession(e *Export, h *handshakeConn) (*session, error) {
	size, err := e.Device.Size()
	if err != nil {
		return nil, fmt.Errorf("nbd: size of export %q: %w", e.Name, err)
	}
	if size < 0 {
		return nil, fmt.Errorf("nbd: export %q has negative size %d", e.Name, size)
	}
	sess := &session{export: e, size: uint64(size), flags: e.transmissionFlags()}
	if h.structured {
		sess.structured = true
		sess.metaAlloc = h.metaExport == e
		sess.flags |= wire.FlagSendDF
	}
	return sess, nil
}

// infoOrGo answers NBD_OPT_INFO or NBD_OPT_GO into out and returns the session on success.
//
// Data: 32-bit name length, name, 16-bit count, count 16-bit information requests. The reply is
// NBD_INFO_EXPORT, NBD_INFO_NAME and NBD_INFO_DESCRIPTION when asked for, NBD_INFO_BLOCK_SIZE
// always (the server enforces MinBlock and MaxBlock, so it tells every client), then ACK.
func (s *Server) infoOrGo(out *bytes.Buffer, h *handshakeConn, id uint32, data []byte) *session {
	name, reqs, ok := parseInfoRequest(data)
	if !ok {
		appendOptionError(out, id, wire.RepErrInvalid, "malformed NBD_OPT_INFO/NBD_OPT_GO data")
		return nil
	}
	e := s.lookup(name)
	if e == nil {
		appendOptionError(out, id, wire.RepErrUnknown, fmt.Sprintf("no export named %q", name))
		return nil
	}
	if rep := s.admit(h, e); rep != 0 {
		appendOptionError(out, id, rep, fmt.Sprintf("access to export %q denied", e.Name))
		return nil
	}
	sess, err := newSession(e, h)
	if err != nil {
		appendOptionError(out, id, wire.RepErrUnknown, "export unavailable")
		return nil
	}
	var wantName, wantDesc bool
	for i := 0; i+1 < len(reqs); i += 2 {
		switch binary.BigEndian.Uint16(reqs[i:]) {
		case wire.InfoName:
			wantName = true
		case wire.InfoDescription:
			wantDesc = true
		}
	}
	var info bytes.Buffer
	binary.Write(&info, binary.BigEndian, protocol.NegotiationReplyInfo{
		Type: wire.InfoExport, Size: sess.size, TransmissionFlags: sess.flags,
	})
	appendOptionReply(out, id, wire.RepInfo, info.Bytes())
	if wantName {
		d := binary.BigEndian.AppendUint16(nil, wire.InfoName)
		appendOptionReply(out, id, wire.RepInfo, append(d, e.Name...))
	}
	if wantDesc && e.Description != "" {
		d := binary.BigEndian.AppendUint16(nil, wire.InfoDescription)
		appendOptionReply(out, id, wire.RepInfo, append(d, e.Description...))
	}
	info.Reset()
	binary.Write(&info, binary.BigEndian, protocol.NegotiationReplyBlockSize{
		Type:               wire.InfoBlockSize,
		MinimumBlockSize:   e.MinBlock,
		PreferredBlockSize: e.PreferredBlock,
		MaximumBlockSize:   e.MaxBlock,
	})
	appendOptionReply(out, id, wire.RepInfo, info.Bytes())
	appendOptionReply(out, id, wire.RepAck, nil)
	return sess
}

// parseInfoRequest splits NBD_OPT_INFO/GO data into the export name and the information
// requests (16-bit each, returned raw). ok is false if the lengths do not add up exactly or the
// name is longer than the protocol allows.
func parseInfoRequest(data []byte) (name string, reqs []byte, ok bool) {
	if len(data) < 6 {
		return "", nil, false
	}
	n := binary.BigEndian.Uint32(data[0:4])
	if n > maxStringLength || uint64(n) > uint64(len(data)-6) {
		return "", nil, false
	}
	name = string(data[4 : 4+n])
	rest := data[4+n:]
	count := int(binary.BigEndian.Uint16(rest[0:2]))
	reqs = rest[2:]
	if len(reqs) != 2*count {
		return "", nil, false
	}
	return name, reqs, true
}

// metaContext answers NBD_OPT_LIST_META_CONTEXT or NBD_OPT_SET_META_CONTEXT into out. The
// server knows one context, base:allocation. A query "base:allocation" matches it, and so
// does "base:" when listing (the protocol's wildcard); other queries of the base namespace and
// queries of any other namespace match nothing and are no error. Listing with no query lists
// it. SET replaces the selection, even when it fails; it needs structured replies
// (NBD_REP_ERR_INVALID before them, as for LIST), selects for the named export only, and
// answers with the context id the connection uses (metaIDAllocation).
func (s *Server) metaContext(out *bytes.Buffer, h *handshakeConn, id uint32, data []byte) {
	set := id == wire.OptSetMetaContext
	if set {
		h.metaExport = nil
	}
	if !h.structured {
		appendOptionError(out, id, wire.RepErrInvalid, "negotiate NBD_OPT_STRUCTURED_REPLY first")
		return
	}
	name, queries, ok := parseMetaRequest(data)
	if !ok {
		appendOptionError(out, id, wire.RepErrInvalid, "malformed metadata context request")
		return
	}
	e := s.lookup(name)
	if e == nil {
		appendOptionError(out, id, wire.RepErrUnknown, fmt.Sprintf("no export named %q", name))
		return
	}
	if rep := s.admit(h, e); rep != 0 {
		appendOptionError(out, id, rep, fmt.Sprintf("access to export %q denied", e.Name))
		return
	}
	match := !set && len(queries) == 0
	for _, q := range queries {
		ns, leaf, ok := strings.Cut(q, ":")
		if !ok || ns == "" {
			appendOptionError(out, id, wire.RepErrInvalid, fmt.Sprintf("query %q has no namespace", q))
			return
		}
		if ns == "base" && (leaf == "allocation" || (leaf == "" && !set)) {
			match = true
		}
	}
	if match {
		ctxID := uint32(0) // reserved in LIST replies
		if set {
			ctxID = metaIDAllocation
			h.metaExport = e
		}
		d := binary.BigEndian.AppendUint32(nil, ctxID)
		appendOptionReply(out, id, wire.RepMetaContext, append(d, wire.MetaBaseAllocation...))
	}
	appendOptionReply(out, id, wire.RepAck, nil)
}

// parseMetaRequest splits NBD_OPT_LIST/SET_META_CONTEXT data: 32-bit name length, name,
// 32-bit query count, and that many queries (32-bit length, string). ok is false unless the
// lengths add up exactly and every string is within the protocol's limit.
func parseMetaRequest(data []byte) (name string, queries []string, ok bool) {
	str := func() (string, bool) {
		if len(data) < 4 {
			return "", false
		}
		n := binary.BigEndian.Uint32(data)
		if n > maxStringLength || uint64(n) > uint64(len(data)-4) {
			return "", false
		}
		v := string(data[4 : 4+n])
		data = data[4+n:]
		return v, true
	}
	if name, ok = str(); !ok || len(data) < 4 {
		return "", nil, false
	}
	count := binary.BigEndian.Uint32(data)
	data = data[4:]
	if uint64(count) > uint64(len(data)/4) { // each query takes 4 bytes at least
		return "", nil, false
	}
	queries = make([]string, 0, count)
	for range count {
		q, ok := str()
		if !ok {
			return "", nil, false
		}
		queries = append(queries, q)
	}
	return name, queries, len(data) == 0
}

// appendOptionReply appends one fixed-newstyle option reply to out.
func appendOptionReply(out *bytes.Buffer, id, typ uint32, data []byte) {
	binary.Write(out, binary.BigEndian, protocol.NegotiationReplyHeader{
		ReplyMagic: wire.MagicOptionReply, ID: id, Type: typ, Length: uint32(len(data)),
	})
	out.Write(data)
}

// appendOptionError appends an error reply with a message for a human.
func appendOptionError(out *bytes.Buffer, id, typ uint32, msg string) {
	appendOptionReply(out, id, typ, []byte(msg))
}
