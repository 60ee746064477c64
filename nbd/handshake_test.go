package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

const testSize = 1 << 20

// twoExports: "disk" (default, writable) and "ro" (read-only, 4 KiB minimum block).
func twoExports() (Options, *nbdtest.MemDevice, *nbdtest.MemDevice) {
	d0, d1 := nbdtest.NewMemDevice(testSize), nbdtest.NewMemDevice(testSize/2)
	return Options{Exports: []Export{
		{Name: "disk", Description: "the test disk", Device: d0},
		{Name: "ro", Device: d1, ReadOnly: true, MinBlock: 4096, PreferredBlock: 65536, MaxBlock: 1 << 20},
	}}, d0, d1
}

func TestNewServerValidation(t *testing.T) {
	dev := nbdtest.NewMemDevice(4096)
	tests := []struct {
		name string
		opts Options
		want error
	}{
		{"no exports", Options{}, ErrNoExports},
		{"nil device", Options{Exports: []Export{{Name: "a"}}}, ErrInvalidExport},
		{"duplicate", Options{Exports: []Export{{Name: "a", Device: dev}, {Name: "a", Device: dev}}}, ErrInvalidExport},
		{"long name", Options{Exports: []Export{{Name: string(make([]byte, 4097)), Device: dev}}}, ErrInvalidExport},
		{"min not pow2", Options{Exports: []Export{{Device: dev, MinBlock: 768}}}, ErrInvalidExport},
		{"min too big", Options{Exports: []Export{{Device: dev, MinBlock: 128 << 10}}}, ErrInvalidExport},
		{"pref below 512", Options{Exports: []Export{{Device: dev, MinBlock: 1, PreferredBlock: 256}}}, ErrInvalidExport},
		{"max below pref", Options{Exports: []Export{{Device: dev, MaxBlock: 1024}}}, ErrInvalidExport},
		{"max not multiple", Options{Exports: []Export{{Device: dev, MaxBlock: 1<<20 + 1}}}, ErrInvalidExport},
		{"negative limit", Options{Exports: []Export{{Device: dev}}, MaxInFlightBytes: -1}, ErrInvalidOptions},
		{"ok", Options{Exports: []Export{{Device: dev}}}, nil},
		{"ok min 1", Options{Exports: []Export{{Device: dev, MinBlock: 1}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewServer(tt.opts)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (s != nil) {
				t.Fatalf("NewServer = %v, %v; want error %v", s, err, tt.want)
			}
		})
	}
	s, _ := NewServer(Options{Exports: []Export{{Device: dev}}})
	if e := s.exports[0]; e.MinBlock != 512 || e.PreferredBlock != 4096 || e.MaxBlock != 32<<20 {
		t.Errorf("defaults: %d/%d/%d, want 512/4096/32 MiB", e.MinBlock, e.PreferredBlock, e.MaxBlock)
	}
}

func TestHandshakeExportName(t *testing.T) {
	for _, tt := range []struct {
		name     string
		export   string
		noZeroes bool
		size     uint64
		flags    uint16
	}{
		{"default with zeroes", "", false, testSize, wire.FlagHasFlags | wire.FlagSendFlush | wire.FlagSendFUA | wire.FlagSendTrim | wire.FlagSendWriteZeroes | wire.FlagCanMultiConn},
		{"named no zeroes", "disk", true, testSize, wire.FlagHasFlags | wire.FlagSendFlush | wire.FlagSendFUA | wire.FlagSendTrim | wire.FlagSendWriteZeroes | wire.FlagCanMultiConn},
		{"read-only", "ro", true, testSize / 2, wire.FlagHasFlags | wire.FlagSendFlush | wire.FlagCanMultiConn | wire.FlagReadOnly},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts, _, _ := twoExports()
			s, _ := testServer(t, opts)
			c, _ := pipe(t, s)
			cf := wire.FlagCFixedNewstyle
			if tt.noZeroes {
				cf |= wire.FlagCNoZeroes
			}
			c.greet(cf)
			c.option(wire.OptExportName, []byte(tt.export))
			b := c.read(10)
			if got := binary.BigEndian.Uint64(b); got != tt.size {
				t.Errorf("size %d, want %d", got, tt.size)
			}
			if got := binary.BigEndian.Uint16(b[8:]); got != tt.flags {
				t.Errorf("flags %#x, want %#x", got, tt.flags)
			}
			if !tt.noZeroes {
				if z := c.read(124); !bytes.Equal(z, make([]byte, 124)) {
					t.Errorf("reserved bytes not zero: %x", z)
				}
			}
			// The stream is in step: the next bytes are a reply to our request.
			if errno, data := c.do(wire.CmdRead, 0, 0, 4096, nil); errno != 0 || !bytes.Equal(data, make([]byte, 4096)) {
				t.Fatalf("READ after EXPORT_NAME: errno %d", errno)
			}
		})
	}
}

func TestHandshakeExportNameUnknownCloses(t *testing.T) {
	opts, _, _ := twoExports()
	s, logs := testServer(t, opts)
	c, done := pipe(t, s)
	c.greet(wire.FlagCFixedNewstyle)
	c.option(wire.OptExportName, []byte("nope"))
	c.expectClosed()
	<-done
	if !logs.loggedErr(ErrUnknownExport) {
		t.Error("no log line with ErrUnknownExport")
	}
}

func TestHandshakeOptions(t *testing.T) {
	opts, _, _ := twoExports()
	s, _ := testServer(t, opts)
	c, _ := pipe(t, s)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)

	t.Run("LIST", func(t *testing.T) {
		c.option(wire.OptList, nil)
		var names []string
		for {
			r := c.optionReply()
			if r.id != wire.OptList {
				t.Fatalf("reply for option %d", r.id)
			}
			if r.typ == wire.RepAck {
				break
			}
			if r.typ != wire.RepServer {
				t.Fatalf("reply type %#x", r.typ)
			}
			n := binary.BigEndian.Uint32(r.data)
			names = append(names, string(r.data[4:4+n])+"|"+string(r.data[4+n:]))
		}
		if want := []string{"disk|the test disk", "ro|"}; len(names) != 2 || names[0] != want[0] || names[1] != want[1] {
			t.Errorf("LIST = %q, want %q", names, want)
		}
	})
	t.Run("LIST with data", func(t *testing.T) {
		c.option(wire.OptList, []byte("x"))
		if r := c.optionReply(); r.typ != wire.RepErrInvalid {
			t.Errorf("reply %#x, want ERR_INVALID", r.typ)
		}
	})
	for _, tt := range []struct {
		name string
		id   uint32
		data []byte
	}{
		{"unknown option with data", 0x4242, []byte("some data that must be skipped")},
		{"STARTTLS", wire.OptStartTLS, nil},
		{"EXTENDED_HEADERS", wire.OptExtendedHeaders, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c.option(tt.id, tt.data)
			if r := c.optionReply(); r.id != tt.id || r.typ != wire.RepErrUnsup {
				t.Errorf("reply (%d, %#x), want (%d, ERR_UNSUP)", r.id, r.typ, tt.id)
			}
		})
	}
	t.Run("INFO everything", func(t *testing.T) {
		c.option(wire.OptInfo, infoData("ro", wire.InfoName, wire.InfoDescription, wire.InfoBlockSize, 0x7777))
		in, final := c.infoReplies(wire.OptInfo)
		if final != wire.RepAck || !in.hasExport || in.size != testSize/2 || in.flags&wire.FlagReadOnly == 0 {
			t.Fatalf("INFO ro: final %#x, %+v", final, in)
		}
		if !in.hasName || in.name != "ro" || in.hasDesc {
			t.Errorf("INFO ro name/description: %+v", in)
		}
		if !in.hasBlock || in.minB != 4096 || in.prefB != 65536 || in.maxB != 1<<20 {
			t.Errorf("INFO ro block sizes: %+v", in)
		}
	})
	t.Run("INFO description", func(t *testing.T) {
		c.option(wire.OptInfo, infoData("", wire.InfoDescription))
		in, final := c.infoReplies(wire.OptInfo)
		if final != wire.RepAck || !in.hasDesc || in.desc != "the test disk" || in.size != testSize {
			t.Errorf("INFO default: final %#x, %+v", final, in)
		}
		if !in.hasBlock || in.minB != 512 || in.prefB != 4096 || in.maxB != 32<<20 {
			t.Errorf("block size info sent unasked should carry the defaults: %+v", in)
		}
	})
	t.Run("INFO unknown export", func(t *testing.T) {
		c.option(wire.OptInfo, infoData("nope", wire.InfoBlockSize))
		if in, final := c.infoReplies(wire.OptInfo); final != wire.RepErrUnknown || in.hasExport {
			t.Errorf("final %#x, %+v; want ERR_UNKNOWN and no info", final, in)
		}
	})
	for _, tt := range []struct {
		name string
		data []byte
	}{
		{"short", []byte{0, 0, 0}},
		{"name too long", append(binary.BigEndian.AppendUint32(nil, 100), 'a', 0, 0)},
		{"count mismatch", append(infoData("disk"), 0, 1)},
	} {
		t.Run("GO malformed "+tt.name, func(t *testing.T) {
			c.option(wire.OptGo, tt.data)
			if _, final := c.infoReplies(wire.OptGo); final != wire.RepErrInvalid {
				t.Errorf("final %#x, want ERR_INVALID", final)
			}
		})
	}
	t.Run("GO unknown export", func(t *testing.T) {
		c.option(wire.OptGo, infoData("nope"))
		if _, final := c.infoReplies(wire.OptGo); final != wire.RepErrUnknown {
			t.Errorf("final %#x, want ERR_UNKNOWN", final)
		}
	})
	t.Run("GO after all that", func(t *testing.T) {
		c.option(wire.OptGo, infoData("disk"))
		in, final := c.infoReplies(wire.OptGo)
		if final != wire.RepAck || in.size != testSize || !in.hasBlock {
			t.Fatalf("GO: final %#x, %+v", final, in)
		}
		if errno, _ := c.do(wire.CmdWrite, 0, 512, 512, bytes.Repeat([]byte{7}, 512)); errno != 0 {
			t.Fatalf("WRITE after GO: errno %d", errno)
		}
	})
}

func TestHandshakeAbort(t *testing.T) {
	opts, _, _ := twoExports()
	s, _ := testServer(t, opts)
	c, done := pipe(t, s)
	c.greet(wire.FlagCFixedNewstyle)
	c.option(wire.OptAbort, nil)
	if r := c.optionReply(); r.id != wire.OptAbort || r.typ != wire.RepAck {
		t.Fatalf("ABORT reply (%d, %#x), want ACK", r.id, r.typ)
	}
	c.expectClosed()
	<-done
}

func TestHandshakeViolationsClose(t *testing.T) {
	for _, tt := range []struct {
		name string
		send func(c *rawClient)
		want error
	}{
		{"unknown client flag", func(c *rawClient) { c.greet(wire.FlagCFixedNewstyle | 4) }, ErrClientFlags},
		{"bad option magic", func(c *rawClient) {
			c.greet(wire.FlagCFixedNewstyle)
			c.write(make([]byte, 16))
		}, ErrBadOptionMagic},
		{"option too long", func(c *rawClient) {
			c.greet(wire.FlagCFixedNewstyle)
			b := binary.BigEndian.AppendUint64(nil, wire.MagicOption)
			b = binary.BigEndian.AppendUint32(b, wire.OptInfo)
			c.write(binary.BigEndian.AppendUint32(b, maxOptionLength+1))
		}, ErrOptionTooLong},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opts, _, _ := twoExports()
			s, logs := testServer(t, opts)
			c, done := pipe(t, s)
			tt.send(c)
			c.expectClosed()
			<-done
			if !logs.loggedErr(tt.want) {
				t.Errorf("no log line with %v", tt.want)
			}
		})
	}
}
