package nbd

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"log/slog"
	"testing"

	"github.com/raid5d/raid5d/nbd/nbdtest"
)

func requestBytes(typ, flags uint16, cookie, off uint64, length uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, magicRequest)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, cookie)
	b = binary.BigEndian.AppendUint64(b, off)
	return binary.BigEndian.AppendUint32(b, length)
}

// FuzzRequestHeader decodes arbitrary request headers and checks that whatever checkRequest
// admits is safe to hand to a Device: a known command, documented flags only, in range without
// overflow, aligned, within MaxBlock, and no writes to a read-only export.
func FuzzRequestHeader(f *testing.F) {
	for _, seed := range [][]byte{
		requestBytes(cmdRead, 0, 1, 0, 4096),
		requestBytes(cmdWrite, cmdFlagFUA, 2, 512, 512),
		requestBytes(cmdWriteZeroes, cmdFlagNoHole|cmdFlagFUA, 3, 1<<20, 1<<30),
		requestBytes(cmdTrim, 0, 4, ^uint64(0)-511, 1024),
		requestBytes(cmdFlush, 0, 5, 0, 0),
		requestBytes(cmdRead, cmdFlagDF, 6, 0, 32<<20+512),
		requestBytes(99, 0xffff, 7, 1, 1),
		requestBytes(cmdDisc, 0, 8, 0, 0),
		requestBytes(cmdBlockStatus, cmdFlagReqOne, 9, 4096, 1000),
		requestBytes(cmdBlockStatus, 0, 10, 0, 0),
		requestBytes(cmdRead, cmdFlagDF, 11, 512, 512),
		make([]byte, requestHeaderSize), // bad magic
	} {
		f.Add(seed, uint64(1<<30), false, uint8(9))
		f.Add(seed, uint64(1<<20+1), true, uint8(0))
		f.Add(seed, uint64(1<<20), false, uint8(128+12))
	}
	// minShift's low bits pick MinBlock; its top bit says the session negotiated structured
	// replies and base:allocation.
	f.Fuzz(func(t *testing.T, raw []byte, size uint64, readOnly bool, minShift uint8) {
		if len(raw) < requestHeaderSize {
			return
		}
		var b [requestHeaderSize]byte
		copy(b[:], raw)
		h := decodeRequest(&b)
		if got := requestBytes(h.Type, h.CommandFlags, h.Handle, h.Offset, h.Length); h.RequestMagic != binary.BigEndian.Uint32(b[:]) || !bytes.Equal(got[4:], b[4:]) {
			t.Fatalf("decode/encode round trip: %x -> %x", b, got)
		}
		e := &Export{Device: nbdtest.NewMemDevice(0), ReadOnly: readOnly, MinBlock: 1 << (minShift % 17)}
		if e.validate() != nil {
			return
		}
		e.fillDefaults()
		sess := &session{export: e, size: size, flags: e.transmissionFlags()}
		if minShift >= 128 {
			sess.structured, sess.metaAlloc = true, true
			sess.flags |= tflagSendDF
		}
		errno, err := checkRequest(&h, sess)
		if err != nil {
			if h.RequestMagic == magicRequest && !(h.Type == cmdWrite && h.Length > e.MaxBlock) {
				t.Fatalf("closed the connection for a request it could answer: %v", err)
			}
			return
		}
		if h.RequestMagic != magicRequest {
			t.Fatalf("admitted bad magic %#x", h.RequestMagic)
		}
		if errno == 0 {
			switch h.Type {
			case cmdRead, cmdWrite, cmdTrim, cmdWriteZeroes, cmdCache, cmdFlush:
			case cmdBlockStatus:
				if !sess.metaAlloc || h.Length == 0 {
					t.Fatalf("admitted BLOCK_STATUS of %d bytes, metaAlloc %v", h.Length, sess.metaAlloc)
				}
			case cmdDisc:
				return
			default:
				t.Fatalf("admitted unknown command %d", h.Type)
			}
			allowed := cmdFlagFUA
			switch {
			case h.Type == cmdWriteZeroes:
				allowed |= cmdFlagNoHole
			case h.Type == cmdBlockStatus:
				allowed |= cmdFlagReqOne
			case h.Type == cmdRead && sess.structured:
				allowed |= cmdFlagDF
			}
			if h.CommandFlags&^allowed != 0 || (readOnly && h.CommandFlags&cmdFlagFUA != 0) {
				t.Fatalf("admitted flags %#x for %s (read-only %v)", h.CommandFlags, cmdName(h.Type), readOnly)
			}
			if h.Type == cmdFlush {
				return
			}
			end := h.Offset + uint64(h.Length)
			if end < h.Offset || end > size {
				t.Fatalf("admitted %s past the end: off %d len %d size %d", cmdName(h.Type), h.Offset, h.Length, size)
			}
			if h.Offset%uint64(e.MinBlock) != 0 {
				t.Fatalf("admitted misaligned offset %d (MinBlock %d)", h.Offset, e.MinBlock)
			}
			if (h.Type == cmdRead || h.Type == cmdWrite) && h.Length > e.MaxBlock {
				t.Fatalf("admitted %s of %d bytes (MaxBlock %d)", cmdName(h.Type), h.Length, e.MaxBlock)
			}
			if readOnly && (h.Type == cmdWrite || h.Type == cmdTrim || h.Type == cmdWriteZeroes) {
				t.Fatalf("admitted %s on a read-only export", cmdName(h.Type))
			}
		}
	})
}

func optionBytes(id uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, magicOption)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// FuzzHandshake feeds arbitrary client bytes to the handshake of a server with TLS off, on or
// required. It must end (the input runs out), never panic, and write a well-formed stream: the
// greeting, then option replies, then for NBD_OPT_EXPORT_NAME the 10 or 134 bytes of export
// information. STARTTLS "upgrades" without cryptography (the stub below), as a client with the
// certificate "alice" or none, so that the rules around it are explored: under TLSRequire
// nothing but STARTTLS and ABORT is served before the upgrade, NBD_REP_ERR_TLS_REQD never comes
// after it, and the export "secret" (AllowedClients: alice) is reached only by alice.
func FuzzHandshake(f *testing.F) {
	flags := binary.BigEndian.AppendUint32(nil, clientFixedNewstyle|clientNoZeroes)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for mode := range uint8(6) {
		f.Add(mode, cat(flags, optionBytes(optGo, infoData("disk", infoBlockSize))))
		f.Add(mode, cat(flags, optionBytes(optList, nil), optionBytes(optInfo, infoData("", infoName, infoDescription)),
			optionBytes(0x77, []byte("junk")), optionBytes(optExportName, nil)))
		f.Add(mode, cat(binary.BigEndian.AppendUint32(nil, 0), optionBytes(optExportName, []byte("disk"))))
		f.Add(mode, cat(flags, optionBytes(optStartTLS, nil), optionBytes(optAbort, nil)))
		f.Add(mode, cat(flags, optionBytes(optGo, []byte{0, 0, 0, 9, 'x'})))
		f.Add(mode, cat(flags, optionBytes(optExportName, []byte("nope"))))
		// STARTTLS flows: the upgrade, a second STARTTLS, STARTTLS with data, then the exports.
		f.Add(mode, cat(flags, optionBytes(optList, nil), optionBytes(optStartTLS, nil),
			optionBytes(optStartTLS, nil), optionBytes(optList, nil), optionBytes(optGo, infoData("secret"))))
		f.Add(mode, cat(flags, optionBytes(optStartTLS, []byte("x")), optionBytes(optStartTLS, nil),
			optionBytes(optInfo, infoData("secret")), optionBytes(optExportName, []byte("secret"))))
		f.Add(mode, cat(flags, optionBytes(optInfo, infoData("secret")), optionBytes(optExportName, []byte("disk"))))
		f.Add(mode, cat(flags, optionBytes(optStartTLS, nil), optionBytes(optExportName, []byte("disk"))))
		// Structured replies and metadata contexts, in and out of order, around STARTTLS.
		f.Add(mode, cat(flags, optionBytes(optSetMetaContext, metaData("disk", "base:allocation")),
			optionBytes(optStructuredReply, nil), optionBytes(optListMetaContext, metaData("disk")),
			optionBytes(optSetMetaContext, metaData("disk", "base:allocation")), optionBytes(optGo, infoData("disk"))))
		f.Add(mode, cat(flags, optionBytes(optStructuredReply, []byte("x")), optionBytes(optStructuredReply, nil),
			optionBytes(optSetMetaContext, metaData("secret", "base:allocation", "x-y:z")),
			optionBytes(optStartTLS, nil), optionBytes(optGo, infoData("secret"))))
		f.Add(mode, cat(flags, optionBytes(optStartTLS, nil), optionBytes(optStructuredReply, nil),
			optionBytes(optListMetaContext, metaData("nope", "base:")), optionBytes(optSetMetaContext, []byte{0, 0, 0, 1}),
			optionBytes(optExtendedHeaders, nil), optionBytes(optExportName, []byte("disk"))))
	}
	servers := make([]*Server, 3)
	for i, m := range []TLSMode{TLSOff, TLSOn, TLSRequire} {
		opts := Options{
			Exports: []Export{{Name: "disk", Description: "d", Device: nbdtest.NewMemDevice(1 << 20)}},
			Logger:  slog.New(slog.DiscardHandler),
			TLSMode: m,
		}
		if m != TLSOff {
			opts.TLSConfig = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven}
			opts.Exports = append(opts.Exports, Export{Name: "secret", Device: nbdtest.NewMemDevice(4096),
				AllowedClients: []string{"alice"}})
		}
		s, err := NewServer(opts)
		if err != nil {
			f.Fatal(err)
		}
		servers[i] = s
	}
	f.Fuzz(func(t *testing.T, mode uint8, in []byte) {
		s := servers[int(mode)%3]
		alice := mode/3%2 == 1
		var out bytes.Buffer
		upgradedAt := -1
		h := &handshakeConn{r: bufio.NewReader(bytes.NewReader(in)), w: &out, log: s.log}
		h.upgrade = func(h *handshakeConn) error {
			if h.peer.tls {
				t.Fatal("a second upgrade")
			}
			upgradedAt = out.Len()
			h.peer.tls = true
			if alice {
				h.peer.certNames = []string{"alice"}
			}
			return nil
		}
		sess, err := s.handshake(h)
		if (sess == nil) == (err == nil) {
			t.Fatalf("handshake = %v, %v: want exactly one", sess, err)
		}
		if sess != nil {
			if sess.metaAlloc && (!sess.structured || h.metaExport != sess.export) {
				t.Fatalf("base:allocation on %q without structured replies or not selected for it", sess.export.Name)
			}
			if (sess.flags&tflagSendDF != 0) != sess.structured {
				t.Fatalf("flags %#x with structured replies %v", sess.flags, sess.structured)
			}
			if s.tlsMode == TLSRequire && !h.peer.tls {
				t.Fatalf("session for %q without TLS under TLSRequire", sess.export.Name)
			}
			if sess.export.Name == "secret" && !alice {
				t.Fatalf("session for the secret export without alice's certificate")
			}
		}
		o := out.Bytes()
		if len(o) < 18 || binary.BigEndian.Uint64(o) != magicNBD {
			t.Fatalf("no greeting: %x", o)
		}
		pos := 18
		for len(o)-pos >= 20 && binary.BigEndian.Uint64(o[pos:]) == magicOptionReply {
			id, typ := binary.BigEndian.Uint32(o[pos+8:]), binary.BigEndian.Uint32(o[pos+12:])
			n := 20 + int(binary.BigEndian.Uint32(o[pos+16:]))
			if n > len(o)-pos {
				t.Fatalf("truncated option reply")
			}
			tlsOn := upgradedAt >= 0 && pos >= upgradedAt
			switch {
			case typ == repErrTLSReqd && (tlsOn || s.tlsMode == TLSOff):
				t.Fatalf("NBD_REP_ERR_TLS_REQD to option %d with TLS %v in mode %v", id, tlsOn, s.tlsMode)
			case s.tlsMode == TLSRequire && !tlsOn && id != optStartTLS && id != optAbort && typ != repErrTLSReqd:
				t.Fatalf("option %d answered %#x before STARTTLS under TLSRequire", id, typ)
			case id == optInfo && typ == repInfo && !alice && bytes.Contains(o[pos+20:pos+n], []byte("secret")):
				t.Fatalf("INFO on the secret export without alice's certificate")
			case typ == repMetaContext && ((id != optListMetaContext && id != optSetMetaContext) ||
				string(o[pos+24:pos+n]) != metaBaseAllocation):
				t.Fatalf("NBD_REP_META_CONTEXT %q to option %d", o[pos+24:pos+n], id)
			}
			pos += n
		}
		o = o[pos:]
		switch {
		case len(o) == 0:
		case sess != nil && (len(o) == 10 || len(o) == 134):
			if binary.BigEndian.Uint64(o) != sess.size {
				t.Fatalf("EXPORT_NAME reply size %d, want %d", binary.BigEndian.Uint64(o), sess.size)
			}
		default:
			t.Fatalf("%d unparsable bytes after the option replies: %x", len(o), o)
		}
	})
}
