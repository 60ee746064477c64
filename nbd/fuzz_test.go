package nbd

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"log/slog"
	"testing"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

func requestBytes(typ, flags uint16, cookie, off uint64, length uint32) []byte {
	var b [wire.RequestHeaderSize]byte
	wire.PutRequest(&b, flags, typ, cookie, off, length)
	return b[:]
}

// FuzzRequestHeader decodes arbitrary request headers and checks that whatever checkRequest
// admits is safe to hand to a Device: a known command, documented flags only, in range without
// overflow, aligned, within MaxBlock, and no writes to a read-only export.
func FuzzRequestHeader(f *testing.F) {
	for _, seed := range [][]byte{
		requestBytes(wire.CmdRead, 0, 1, 0, 4096),
		requestBytes(wire.CmdWrite, wire.CmdFlagFUA, 2, 512, 512),
		requestBytes(wire.CmdWriteZeroes, wire.CmdFlagNoHole|wire.CmdFlagFUA, 3, 1<<20, 1<<30),
		requestBytes(wire.CmdTrim, 0, 4, ^uint64(0)-511, 1024),
		requestBytes(wire.CmdFlush, 0, 5, 0, 0),
		requestBytes(wire.CmdRead, wire.CmdFlagDF, 6, 0, 32<<20+512),
		requestBytes(99, 0xffff, 7, 1, 1),
		requestBytes(wire.CmdDisc, 0, 8, 0, 0),
		requestBytes(wire.CmdBlockStatus, wire.CmdFlagReqOne, 9, 4096, 1000),
		requestBytes(wire.CmdBlockStatus, 0, 10, 0, 0),
		requestBytes(wire.CmdRead, wire.CmdFlagDF, 11, 512, 512),
		make([]byte, wire.RequestHeaderSize), // bad magic
	} {
		f.Add(seed, uint64(1<<30), false, uint8(9))
		f.Add(seed, uint64(1<<20+1), true, uint8(0))
		f.Add(seed, uint64(1<<20), false, uint8(128+12))
	}
	// minShift's low bits pick MinBlock; its top bit says the session negotiated structured
	// replies and base:allocation.
	f.Fuzz(func(t *testing.T, raw []byte, size uint64, readOnly bool, minShift uint8) {
		if len(raw) < wire.RequestHeaderSize {
			return
		}
		var b [wire.RequestHeaderSize]byte
		copy(b[:], raw)
		h := wire.DecodeRequest(&b)
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
			sess.flags |= wire.FlagSendDF
		}
		errno, err := checkRequest(&h, sess)
		if err != nil {
			if h.RequestMagic == wire.MagicRequest && !(h.Type == wire.CmdWrite && h.Length > e.MaxBlock) {
				t.Fatalf("closed the connection for a request it could answer: %v", err)
			}
			return
		}
		if h.RequestMagic != wire.MagicRequest {
			t.Fatalf("admitted bad magic %#x", h.RequestMagic)
		}
		if errno == 0 {
			switch h.Type {
			case wire.CmdRead, wire.CmdWrite, wire.CmdTrim, wire.CmdWriteZeroes, wire.CmdCache, wire.CmdFlush:
			case wire.CmdBlockStatus:
				if !sess.metaAlloc || h.Length == 0 {
					t.Fatalf("admitted BLOCK_STATUS of %d bytes, metaAlloc %v", h.Length, sess.metaAlloc)
				}
			case wire.CmdDisc:
				return
			default:
				t.Fatalf("admitted unknown command %d", h.Type)
			}
			allowed := wire.CmdFlagFUA
			switch {
			case h.Type == wire.CmdWriteZeroes:
				allowed |= wire.CmdFlagNoHole
			case h.Type == wire.CmdBlockStatus:
				allowed |= wire.CmdFlagReqOne
			case h.Type == wire.CmdRead && sess.structured:
				allowed |= wire.CmdFlagDF
			}
			if h.CommandFlags&^allowed != 0 || (readOnly && h.CommandFlags&wire.CmdFlagFUA != 0) {
				t.Fatalf("admitted flags %#x for %s (read-only %v)", h.CommandFlags, wire.CmdName(h.Type), readOnly)
			}
			if h.Type == wire.CmdFlush {
				return
			}
			end := h.Offset + uint64(h.Length)
			if end < h.Offset || end > size {
				t.Fatalf("admitted %s past the end: off %d len %d size %d", wire.CmdName(h.Type), h.Offset, h.Length, size)
			}
			if h.Offset%uint64(e.MinBlock) != 0 {
				t.Fatalf("admitted misaligned offset %d (MinBlock %d)", h.Offset, e.MinBlock)
			}
			if (h.Type == wire.CmdRead || h.Type == wire.CmdWrite) && h.Length > e.MaxBlock {
				t.Fatalf("admitted %s of %d bytes (MaxBlock %d)", wire.CmdName(h.Type), h.Length, e.MaxBlock)
			}
			if readOnly && (h.Type == wire.CmdWrite || h.Type == wire.CmdTrim || h.Type == wire.CmdWriteZeroes) {
				t.Fatalf("admitted %s on a read-only export", wire.CmdName(h.Type))
			}
		}
	})
}

func optionBytes(id uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, wire.MagicOption)
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
	flags := binary.BigEndian.AppendUint32(nil, wire.FlagCFixedNewstyle|wire.FlagCNoZeroes)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for mode := range uint8(6) {
		f.Add(mode, cat(flags, optionBytes(wire.OptGo, infoData("disk", wire.InfoBlockSize))))
		f.Add(mode, cat(flags, optionBytes(wire.OptList, nil), optionBytes(wire.OptInfo, infoData("", wire.InfoName, wire.InfoDescription)),
			optionBytes(0x77, []byte("junk")), optionBytes(wire.OptExportName, nil)))
		f.Add(mode, cat(binary.BigEndian.AppendUint32(nil, 0), optionBytes(wire.OptExportName, []byte("disk"))))
		f.Add(mode, cat(flags, optionBytes(wire.OptStartTLS, nil), optionBytes(wire.OptAbort, nil)))
		f.Add(mode, cat(flags, optionBytes(wire.OptGo, []byte{0, 0, 0, 9, 'x'})))
		f.Add(mode, cat(flags, optionBytes(wire.OptExportName, []byte("nope"))))
		// STARTTLS flows: the upgrade, a second STARTTLS, STARTTLS with data, then the exports.
		f.Add(mode, cat(flags, optionBytes(wire.OptList, nil), optionBytes(wire.OptStartTLS, nil),
			optionBytes(wire.OptStartTLS, nil), optionBytes(wire.OptList, nil), optionBytes(wire.OptGo, infoData("secret"))))
		f.Add(mode, cat(flags, optionBytes(wire.OptStartTLS, []byte("x")), optionBytes(wire.OptStartTLS, nil),
			optionBytes(wire.OptInfo, infoData("secret")), optionBytes(wire.OptExportName, []byte("secret"))))
		f.Add(mode, cat(flags, optionBytes(wire.OptInfo, infoData("secret")), optionBytes(wire.OptExportName, []byte("disk"))))
		f.Add(mode, cat(flags, optionBytes(wire.OptStartTLS, nil), optionBytes(wire.OptExportName, []byte("disk"))))
		// Structured replies and metadata contexts, in and out of order, around STARTTLS.
		f.Add(mode, cat(flags, optionBytes(wire.OptSetMetaContext, metaData("disk", "base:allocation")),
			optionBytes(wire.OptStructuredReply, nil), optionBytes(wire.OptListMetaContext, metaData("disk")),
			optionBytes(wire.OptSetMetaContext, metaData("disk", "base:allocation")), optionBytes(wire.OptGo, infoData("disk"))))
		f.Add(mode, cat(flags, optionBytes(wire.OptStructuredReply, []byte("x")), optionBytes(wire.OptStructuredReply, nil),
			optionBytes(wire.OptSetMetaContext, metaData("secret", "base:allocation", "x-y:z")),
			optionBytes(wire.OptStartTLS, nil), optionBytes(wire.OptGo, infoData("secret"))))
		f.Add(mode, cat(flags, optionBytes(wire.OptStartTLS, nil), optionBytes(wire.OptStructuredReply, nil),
			optionBytes(wire.OptListMetaContext, metaData("nope", "base:")), optionBytes(wire.OptSetMetaContext, []byte{0, 0, 0, 1}),
			optionBytes(wire.OptExtendedHeaders, nil), optionBytes(wire.OptExportName, []byte("disk"))))
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
			if (sess.flags&wire.FlagSendDF != 0) != sess.structured {
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
		if len(o) < 18 || binary.BigEndian.Uint64(o) != wire.MagicNBD {
			t.Fatalf("no greeting: %x", o)
		}
		pos := 18
		for len(o)-pos >= 20 && binary.BigEndian.Uint64(o[pos:]) == wire.MagicOptionReply {
			id, typ := binary.BigEndian.Uint32(o[pos+8:]), binary.BigEndian.Uint32(o[pos+12:])
			n := 20 + int(binary.BigEndian.Uint32(o[pos+16:]))
			if n > len(o)-pos {
				t.Fatalf("truncated option reply")
			}
			tlsOn := upgradedAt >= 0 && pos >= upgradedAt
			switch {
			case typ == wire.RepErrTLSReqd && (tlsOn || s.tlsMode == TLSOff):
				t.Fatalf("NBD_REP_ERR_TLS_REQD to option %d with TLS %v in mode %v", id, tlsOn, s.tlsMode)
			case s.tlsMode == TLSRequire && !tlsOn && id != wire.OptStartTLS && id != wire.OptAbort && typ != wire.RepErrTLSReqd:
				t.Fatalf("option %d answered %#x before STARTTLS under TLSRequire", id, typ)
			case id == wire.OptInfo && typ == wire.RepInfo && !alice && bytes.Contains(o[pos+20:pos+n], []byte("secret")):
				t.Fatalf("INFO on the secret export without alice's certificate")
			case typ == wire.RepMetaContext && ((id != wire.OptListMetaContext && id != wire.OptSetMetaContext) ||
				string(o[pos+24:pos+n]) != wire.MetaBaseAllocation):
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
