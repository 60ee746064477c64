package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// chunk is one structured reply chunk as the client reads it.
type chunk struct {
	flags, typ uint16
	cookie     uint64
	payload    []byte
}

// chunk reads one structured reply chunk, failing on any other message.
func (c *rawClient) chunk() chunk {
	c.t.Helper()
	h := c.read(wire.ChunkHeaderSize)
	if m := binary.BigEndian.Uint32(h); m != wire.MagicStructuredReply {
		c.t.Fatalf("reply magic %#x, want a structured reply chunk", m)
	}
	ch := chunk{flags: binary.BigEndian.Uint16(h[4:]), typ: binary.BigEndian.Uint16(h[6:]),
		cookie: binary.BigEndian.Uint64(h[8:])}
	ch.payload = c.read(int(binary.BigEndian.Uint32(h[16:])))
	return ch
}

// errorChunk decodes an error chunk's payload: error, message, and offset for ERROR_OFFSET
// (else -1). It fails on a malformed one.
func (ch chunk) errorChunk(t *testing.T) (errno uint32, msg string, off int64) {
	t.Helper()
	if ch.typ != wire.ReplyTypeError && ch.typ != wire.ReplyTypeErrorOffset {
		t.Fatalf("chunk type %#x, want an error chunk", ch.typ)
	}
	p := ch.payload
	if len(p) < 6 {
		t.Fatalf("error chunk of %d bytes", len(p))
	}
	errno = binary.BigEndian.Uint32(p)
	n := int(binary.BigEndian.Uint16(p[4:]))
	rest := p[6:]
	if n > len(rest) {
		t.Fatalf("message length %d past the chunk (%d)", n, len(rest))
	}
	msg, rest = string(rest[:n]), rest[n:]
	off = -1
	if ch.typ == wire.ReplyTypeErrorOffset {
		if len(rest) != 8 {
			t.Fatalf("ERROR_OFFSET with %d bytes after the message", len(rest))
		}
		off = int64(binary.BigEndian.Uint64(rest))
	} else if len(rest) != 0 {
		t.Fatalf("ERROR with %d bytes after the message", len(rest))
	}
	if errno == 0 {
		t.Fatal("error chunk with error 0")
	}
	return errno, msg, off
}

// metaData builds NBD_OPT_LIST/SET_META_CONTEXT data.
func metaData(export string, queries ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	b = append(b, export...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = binary.BigEndian.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// metaReplies reads the replies to a metadata context option up to the final one and returns
// the contexts ("id name") and the final reply type.
func (c *rawClient) metaReplies(id uint32) ([]string, uint32) {
	c.t.Helper()
	var ctxs []string
	for {
		r := c.optionReply()
		if r.id != id {
			c.t.Fatalf("reply to option %d, want %d", r.id, id)
		}
		if r.typ != wire.RepMetaContext {
			return ctxs, r.typ
		}
		ctxs = append(ctxs, fmt.Sprintf("%d %s", binary.BigEndian.Uint32(r.data), r.data[4:]))
	}
}

// structuredGo negotiates structured replies, selects base:allocation on export if meta is
// set, and enters transmission on export.
func (c *rawClient) structuredGo(export string, meta bool) exportInfo {
	c.t.Helper()
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	c.option(wire.OptStructuredReply, nil)
	if r := c.optionReply(); r.typ != wire.RepAck {
		c.t.Fatalf("STRUCTURED_REPLY: reply %#x", r.typ)
	}
	if meta {
		c.option(wire.OptSetMetaContext, metaData(export, "base:allocation"))
		if ctxs, final := c.metaReplies(wire.OptSetMetaContext); final != wire.RepAck || len(ctxs) != 1 {
			c.t.Fatalf("SET_META_CONTEXT: %q, final %#x", ctxs, final)
		}
	}
	c.option(wire.OptGo, infoData(export, wire.InfoBlockSize))
	in, final := c.infoReplies(wire.OptGo)
	if final != wire.RepAck {
		c.t.Fatalf("NBD_OPT_GO %q: final reply %#x", export, final)
	}
	return in
}

func TestStructuredNegotiation(t *testing.T) {
	opts, _, _ := twoExports()
	s, _ := testServer(t, opts)
	c, _ := pipe(t, s)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	expect := func(id uint32, data []byte, want []string, wantFinal uint32) {
		t.Helper()
		c.option(id, data)
		got, final := c.metaReplies(id)
		if final != wantFinal || strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("option %d %q: %q final %#x, want %q final %#x", id, data, got, final, want, wantFinal)
		}
	}
	// Before STRUCTURED_REPLY, the metadata options are invalid.
	expect(wire.OptListMetaContext, metaData("disk"), nil, wire.RepErrInvalid)
	expect(wire.OptSetMetaContext, metaData("disk", "base:allocation"), nil, wire.RepErrInvalid)

	c.option(wire.OptStructuredReply, []byte("x"))
	if r := c.optionReply(); r.typ != wire.RepErrInvalid {
		t.Errorf("STRUCTURED_REPLY with data: %#x, want ERR_INVALID", r.typ)
	}
	c.option(wire.OptStructuredReply, nil)
	if r := c.optionReply(); r.id != wire.OptStructuredReply || r.typ != wire.RepAck || len(r.data) != 0 {
		t.Fatalf("STRUCTURED_REPLY: %+v, want ACK", r)
	}
	c.option(wire.OptExtendedHeaders, nil)
	if r := c.optionReply(); r.typ != wire.RepErrUnsup {
		t.Errorf("EXTENDED_HEADERS: %#x, want ERR_UNSUP", r.typ)
	}

	const alloc = "0 base:allocation"
	expect(wire.OptListMetaContext, metaData("disk"), []string{alloc}, wire.RepAck)
	expect(wire.OptListMetaContext, metaData("", "base:"), []string{alloc}, wire.RepAck)
	expect(wire.OptListMetaContext, metaData("ro", "base:allocation", "base:"), []string{alloc}, wire.RepAck)
	expect(wire.OptListMetaContext, metaData("disk", "qemu:dirty-bitmap:x", "x-foo:", "base:other"), nil, wire.RepAck)
	expect(wire.OptListMetaContext, metaData("disk", "nocolon"), nil, wire.RepErrInvalid)
	expect(wire.OptListMetaContext, metaData("disk", ":allocation"), nil, wire.RepErrInvalid)
	expect(wire.OptListMetaContext, metaData("nope"), nil, wire.RepErrUnknown)
	expect(wire.OptListMetaContext, append(metaData("disk", "base:"), 0), nil, wire.RepErrInvalid)
	expect(wire.OptListMetaContext, metaData("disk")[:6], nil, wire.RepErrInvalid)
	expect(wire.OptListMetaContext, binary.BigEndian.AppendUint32(metaData("disk"), 1<<30), nil, wire.RepErrInvalid)

	expect(wire.OptSetMetaContext, metaData("disk"), nil, wire.RepAck)          // no query selects nothing
	expect(wire.OptSetMetaContext, metaData("disk", "base:"), nil, wire.RepAck) // the wildcard is for listing
	expect(wire.OptSetMetaContext, metaData("disk", "x-a:b", "base:allocation", "base:allocation"),
		[]string{fmt.Sprintf("%d base:allocation", metaIDAllocation)}, wire.RepAck)
	expect(wire.OptSetMetaContext, metaData("nope", "base:allocation"), nil, wire.RepErrUnknown)
}

// holeDevice is a MemDevice that knows its holes: every 4 KiB block that is all zeroes is a
// hole (HOLE|ZERO), the rest data, one Extent per block; ext, when set, replaces the answer.
type holeDevice struct {
	*nbdtest.MemDevice
	mu    sync.Mutex
	calls int
	ext   func(off, length int64) []Extent
}

func (d *holeDevice) BlockStatus(off, length int64, dst []Extent) ([]Extent, error) {
	d.mu.Lock()
	d.calls++
	d.mu.Unlock()
	if d.ext != nil {
		return append(dst, d.ext(off, length)...), nil
	}
	if d.Fail != nil {
		if err := d.Fail(nbdtest.OpRead, off, length); err != nil {
			return nil, err
		}
	}
	b := d.Bytes()
	for p := off; p < off+length && len(dst) < cap(dst); {
		n := min(4096-p%4096, off+length-p)
		f := ExtentFlags(0)
		if allZero(b[p : p+n]) {
			f = ExtentHole | ExtentZero
		}
		dst = append(dst, Extent{Length: n, Flags: f})
		p += n
	}
	return dst, nil
}

func (d *holeDevice) callCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

func allZero(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

// blockStatus sends a BLOCK_STATUS and returns its extents as "length:flags" strings, checking
// the chunk: one BLOCK_STATUS chunk with DONE for the connection's context.
func (c *rawClient) blockStatus(t *testing.T, flags uint16, off uint64, length uint32) []string {
	t.Helper()
	c.request(wire.CmdBlockStatus, flags, 77, off, length, nil)
	ch := c.chunk()
	if ch.cookie != 77 || ch.flags != wire.ReplyFlagDone {
		t.Fatalf("BLOCK_STATUS reply: cookie %d flags %#x", ch.cookie, ch.flags)
	}
	if ch.typ != wire.ReplyTypeBlockStatus {
		errno, msg, _ := ch.errorChunk(t)
		t.Fatalf("BLOCK_STATUS failed: errno %d %q", errno, msg)
	}
	p := ch.payload
	if len(p) < 12 || (len(p)-4)%8 != 0 || binary.BigEndian.Uint32(p) != metaIDAllocation {
		t.Fatalf("BLOCK_STATUS payload of %d bytes, context %d", len(p), binary.BigEndian.Uint32(p))
	}
	var ext []string
	var sum uint64
	for p = p[4:]; len(p) > 0; p = p[8:] {
		n, f := binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])
		if n == 0 {
			t.Fatal("extent of length 0")
		}
		sum += uint64(n)
		ext = append(ext, fmt.Sprintf("%d:%d", n, f))
	}
	if sum > uint64(length) {
		t.Fatalf("extents cover %d bytes, more than the %d asked", sum, length)
	}
	return ext
}

func TestStructuredReads(t *testing.T) {
	mem := nbdtest.NewMemDevice(testSize)
	s, logs := testServer(t, Options{Exports: []Export{{Name: "disk", Device: mem}}})
	c, _ := pipe(t, s)
	in := c.structuredGo("disk", false)
	if in.flags&wire.FlagSendDF == 0 {
		t.Errorf("flags %#x: want SEND_DF with structured replies", in.flags)
	}
	model := make([]byte, testSize)
	p := pattern(7, 256<<10)
	copy(model[8192:], p)
	c.request(wire.CmdWrite, 0, 1, 8192, uint32(len(p)), p)
	if ch := c.chunk(); ch.cookie != 1 || ch.typ != wire.ReplyTypeNone || ch.flags != wire.ReplyFlagDone || len(ch.payload) != 0 {
		t.Fatalf("WRITE reply %+v, want NONE with DONE", ch)
	}

	// Many reads at once, so that replies are coalesced; every byte compared.
	type rd struct{ off, n uint64 }
	var reads []rd
	for i := range uint64(48) {
		reads = append(reads, rd{(i * 37 * 512) % (testSize - 128<<10), 512 * (1 + i*13%256)})
	}
	for i, r := range reads {
		flags := uint16(0)
		if i%3 == 0 {
			flags = wire.CmdFlagDF
		}
		c.request(wire.CmdRead, flags, uint64(100+i), r.off, uint32(r.n), nil)
	}
	for range reads {
		ch := c.chunk()
		i := int(ch.cookie) - 100
		if i < 0 || i >= len(reads) || ch.typ != wire.ReplyTypeOffsetData || ch.flags != wire.ReplyFlagDone {
			t.Fatalf("READ reply: cookie %d type %#x flags %#x", ch.cookie, ch.typ, ch.flags)
		}
		r := reads[i]
		if got := binary.BigEndian.Uint64(ch.payload); got != r.off || uint64(len(ch.payload)-8) != r.n {
			t.Fatalf("READ %d: chunk offset %d, %d bytes; want %d, %d", i, got, len(ch.payload)-8, r.off, r.n)
		}
		if j := firstDiff(ch.payload[8:], model[r.off:r.off+r.n]); j >= 0 {
			t.Fatalf("READ %d at %d differs at byte %d", i, r.off, j)
		}
	}

	c.request(wire.CmdRead, 0, 2, 0, 0, nil)
	if ch := c.chunk(); ch.cookie != 2 || ch.typ != wire.ReplyTypeNone || ch.flags != wire.ReplyFlagDone {
		t.Errorf("READ of 0 bytes: %+v, want NONE with DONE", ch)
	}

	// Refused by the reader: an error chunk, never a simple reply to a READ.
	for _, tt := range []struct {
		name   string
		typ    uint16
		flags  uint16
		off    uint64
		length uint32
	}{
		{"READ past end", wire.CmdRead, 0, testSize - 512, 1024},
		{"READ misaligned", wire.CmdRead, 0, 100, 512},
		{"READ unknown flag", wire.CmdRead, wire.CmdFlagReqOne, 0, 512},
		{"BLOCK_STATUS without a context", wire.CmdBlockStatus, 0, 0, 4096},
		{"unknown command", 42, 0, 0, 0},
	} {
		c.request(tt.typ, tt.flags, 3, tt.off, tt.length, nil)
		ch := c.chunk()
		if ch.cookie != 3 || ch.flags != wire.ReplyFlagDone {
			t.Fatalf("%s: cookie %d flags %#x", tt.name, ch.cookie, ch.flags)
		}
		if errno, msg, off := ch.errorChunk(t); errno != wire.EINVAL || off != -1 || !strings.Contains(msg, "invalid argument") {
			t.Errorf("%s: errno %d %q offset %d, want EINVAL with a message", tt.name, errno, msg, off)
		}
	}

	// A failing device read: ERROR_OFFSET within the request, the connection goes on.
	mem.Fail = func(op nbdtest.Op, off, n int64) error {
		if op == nbdtest.OpRead && off == 65536 {
			return errors.New("injected")
		}
		return nil
	}
	c.request(wire.CmdRead, 0, 4, 65536, 8192, nil)
	ch := c.chunk()
	errno, msg, off := ch.errorChunk(t)
	if ch.cookie != 4 || ch.flags != wire.ReplyFlagDone || errno != wire.EIO || off < 65536 || off >= 65536+8192 || msg != "READ: input/output error" {
		t.Errorf("failed READ: cookie %d flags %#x errno %d %q offset %d", ch.cookie, ch.flags, errno, msg, off)
	}
	if !logs.loggedMsg("nbd: request failed") {
		t.Error("failed READ not logged")
	}
	mem.Fail = nil
	c.request(wire.CmdRead, 0, 5, 8192, 4096, nil)
	if ch := c.chunk(); ch.typ != wire.ReplyTypeOffsetData || !bytes.Equal(ch.payload[8:], model[8192:8192+4096]) {
		t.Errorf("READ after the failure: type %#x", ch.typ)
	}
	// Other commands: NONE, and an error chunk for a failure.
	for _, typ := range []uint16{wire.CmdFlush, wire.CmdTrim, wire.CmdWriteZeroes, wire.CmdCache} {
		c.request(typ, 0, 6, 1<<19, 4096, nil)
		if ch := c.chunk(); ch.cookie != 6 || ch.typ != wire.ReplyTypeNone || ch.flags != wire.ReplyFlagDone {
			t.Errorf("%s: %+v, want NONE with DONE", wire.CmdName(typ), ch)
		}
	}
	mem.Fail = func(op nbdtest.Op, off, n int64) error { return errors.New("injected") }
	c.request(wire.CmdFlush, 0, 8, 0, 0, nil)
	if errno, _, off := c.chunk().errorChunk(t); errno != wire.EIO || off != -1 {
		t.Errorf("failed FLUSH: errno %d offset %d, want EIO and no offset", errno, off)
	}
	mem.Fail = nil
	checkDevice(t, mem, func() []byte { clear(model[1<<19 : 1<<19+4096]); return model }())
}

// loggedMsg reports whether some record has msg as its message.
func (l *logStore) loggedMsg(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Message == msg {
			return true
		}
	}
	return false
}

func TestBlockStatus(t *testing.T) {
	hd := &holeDevice{MemDevice: nbdtest.NewMemDevice(testSize)}
	plain := nbdtest.NewMemDevice(testSize)
	s, _ := testServer(t, Options{Exports: []Export{
		{Name: "holes", Device: hd},
		{Name: "plain", Device: plain},
	}})
	c, _ := pipe(t, s)
	c.structuredGo("holes", true)
	const hz = ExtentHole | ExtentZero
	want := func(got []string, want ...string) {
		t.Helper()
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("extents %q, want %q", got, want)
		}
	}
	// All zero: one merged hole, whatever the device's granularity.
	want(c.blockStatus(t, 0, 0, testSize), fmt.Sprintf("%d:%d", testSize, hz))
	// Data in [8 KiB, 16 KiB) and [64 KiB, 68 KiB).
	c.request(wire.CmdWrite, 0, 1, 8192, 8192, pattern(1, 8192))
	c.chunk()
	c.request(wire.CmdWrite, 0, 1, 65536, 4096, pattern(2, 4096))
	c.chunk()
	want(c.blockStatus(t, 0, 0, 128<<10), "8192:3", "8192:0", "49152:3", "4096:0", "61440:3")
	want(c.blockStatus(t, wire.CmdFlagReqOne, 0, 128<<10), "8192:3")
	want(c.blockStatus(t, wire.CmdFlagReqOne, 8192, 4096), "4096:0")
	want(c.blockStatus(t, wire.CmdFlagReqOne, 12288, 65536), "4096:0")
	// An unaligned length is fine for BLOCK_STATUS; the extents stop at it.
	want(c.blockStatus(t, 0, 4096, 5000), "4096:3", "904:0")

	// Refusals: past the end, zero length, an unknown flag.
	for _, tt := range []struct {
		flags  uint16
		off    uint64
		length uint32
	}{{0, testSize - 4096, 8192}, {0, 0, 0}, {wire.CmdFlagNoHole, 0, 4096}, {0, 100, 4096}} {
		c.request(wire.CmdBlockStatus, tt.flags, 9, tt.off, tt.length, nil)
		if errno, _, _ := c.chunk().errorChunk(t); errno != wire.EINVAL {
			t.Errorf("BLOCK_STATUS %+v: errno %d, want EINVAL", tt, errno)
		}
	}

	// A device answering in tiny alternating extents: the reply is capped, and covers a prefix.
	hd.ext = func(off, length int64) []Extent {
		var e []Extent
		for i := int64(0); i < length/128; i++ {
			e = append(e, Extent{Length: 128, Flags: ExtentFlags(i%2) * hz})
		}
		return e
	}
	got := c.blockStatus(t, 0, 0, testSize)
	if len(got) != maxBlockStatusExtents || got[0] != "128:0" || got[1] != "128:3" {
		t.Errorf("%d extents (%v...), want %d alternating", len(got), got[:2], maxBlockStatusExtents)
	}
	// A device that breaks its contract: extents kept only while they are sound.
	for _, tt := range []struct {
		ext  []Extent
		want []string
	}{
		{nil, []string{"65536:0"}},
		{[]Extent{{4096, hz}, {0, 0}, {4096, 0}}, []string{"4096:3"}},
		{[]Extent{{4096, hz | 0x40}, {8192, hz}, {1 << 20, 0}}, []string{"12288:3"}},
		{[]Extent{{-1, hz}}, []string{"65536:0"}},
	} {
		hd.ext = func(off, length int64) []Extent { return tt.ext }
		want(c.blockStatus(t, 0, 0, 65536), tt.want...)
	}
	hd.ext = nil
	// A failing device: an error chunk.
	hd.Fail = func(op nbdtest.Op, off, n int64) error { return errnoErr(wire.EIO) }
	c.request(wire.CmdBlockStatus, 0, 10, 0, 4096, nil)
	if errno, _, _ := c.chunk().errorChunk(t); errno != wire.EIO {
		t.Errorf("failing BlockStatus: errno %d, want EIO", errno)
	}
	hd.Fail = nil

	// A device without BlockStatus: all data, as asked; REQ_ONE too.
	p, _ := pipe(t, s)
	p.structuredGo("plain", true)
	want(p.blockStatus(t, 0, 4096, 1<<19), fmt.Sprintf("%d:0", 1<<19))
	want(p.blockStatus(t, wire.CmdFlagReqOne, 0, testSize), fmt.Sprintf("%d:0", testSize))

	// base:allocation selected for another export: BLOCK_STATUS is refused.
	o, _ := pipe(t, s)
	o.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	o.option(wire.OptStructuredReply, nil)
	o.optionReply()
	o.option(wire.OptSetMetaContext, metaData("plain", "base:allocation"))
	o.metaReplies(wire.OptSetMetaContext)
	o.option(wire.OptGo, infoData("holes"))
	if _, final := o.infoReplies(wire.OptGo); final != wire.RepAck {
		t.Fatal("GO failed")
	}
	calls := hd.callCount()
	o.request(wire.CmdBlockStatus, 0, 11, 0, 4096, nil)
	if errno, _, _ := o.chunk().errorChunk(t); errno != wire.EINVAL || hd.callCount() != calls {
		t.Errorf("BLOCK_STATUS with the context set for another export: errno %d, want EINVAL", errno)
	}
}
