package wire

import (
	"syscall"
	"testing"
)

// TestHeaders: each header encodes at the offsets doc/proto.md gives and decodes back.
func TestHeaders(t *testing.T) {
	var rq [RequestHeaderSize]byte
	PutRequest(&rq, CmdFlagFUA, CmdWrite, 0x0102030405060708, 1<<40, 4096)
	want := []byte{0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x10, 0}
	if string(rq[:]) != string(want) {
		t.Errorf("request header % x, want % x", rq, want)
	}
	h := DecodeRequest(&rq)
	if h.RequestMagic != MagicRequest || h.CommandFlags != CmdFlagFUA || h.Type != CmdWrite ||
		h.Handle != 0x0102030405060708 || h.Offset != 1<<40 || h.Length != 4096 {
		t.Errorf("DecodeRequest = %+v", h)
	}

	var rp [ReplyHeaderSize]byte
	PutReply(&rp, EIO, 7)
	want = []byte{0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 7}
	if string(rp[:]) != string(want) {
		t.Errorf("reply header % x, want % x", rp, want)
	}
	if r := DecodeReply(&rp); r.ReplyMagic != MagicSimpleReply || r.Error != EIO || r.Handle != 7 {
		t.Errorf("DecodeReply = %+v", r)
	}

	ch := make([]byte, ChunkHeaderSize)
	PutChunk(ch, ReplyFlagDone, ReplyTypeErrorOffset, 9, 300)
	want = []byte{0x66, 0x8e, 0x33, 0xef, 0, 1, 0x80, 2, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 1, 44}
	if string(ch) != string(want) {
		t.Errorf("chunk header % x, want % x", ch, want)
	}
}

// TestErrnos: the protocol's error values are Linux's, and each has a name and a text.
func TestErrnos(t *testing.T) {
	for _, e := range errnos {
		if e.errno != uint32(nameToErrno[e.name]) {
			t.Errorf("%s = %d, want %d", e.name, e.errno, nameToErrno[e.name])
		}
		if ErrnoName(e.errno) != e.name || ErrnoText(e.errno) == "error" {
			t.Errorf("%d: name %q, text %q", e.errno, ErrnoName(e.errno), ErrnoText(e.errno))
		}
	}
	if got := ErrnoName(uint32(syscall.ENOENT)); got != syscall.ENOENT.Error() {
		t.Errorf("ErrnoName(ENOENT) = %q", got)
	}
	if got := ErrnoText(2); got != "error" {
		t.Errorf("ErrnoText(2) = %q", got)
	}
	if CmdName(CmdBlockStatus) != "BLOCK_STATUS" || CmdName(99) != "unknown" {
		t.Error("CmdName")
	}
}

var nameToErrno = map[string]syscall.Errno{
	"EPERM": syscall.EPERM, "EIO": syscall.EIO, "ENOMEM": syscall.ENOMEM, "EINVAL": syscall.EINVAL,
	"ENOSPC": syscall.ENOSPC, "EOVERFLOW": syscall.EOVERFLOW, "ENOTSUP": syscall.ENOTSUP,
	"ESHUTDOWN": syscall.ESHUTDOWN,
}
