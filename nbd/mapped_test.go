package nbd

import (
	"sync/atomic"
	"testing"

	"github.com/raid5d/raid5d/nbd/internal/wire"
	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// mappedDevice is a MemDevice that answers reads as a MappedReader: slices of mem (the
// device's bytes, which the test does not change) in 4 KiB pieces, every third piece copied into p instead, and reads at offsets that are a
// whose KiB count is a multiple of 3 refused (the server must then use ReadAt). It counts what it hands out
// and what is released.
type mappedDevice struct {
	*nbdtest.MemDevice
	mem                   []byte
	mapped, refused, held atomic.Int64
}

func (d *mappedDevice) ReadMapped(p []byte, off int64, v [][]byte) ([][]byte, bool) {
	if (off/1024)%3 == 0 {
		d.refused.Add(1)
		return v, false
	}
	mem := d.mem
	for i, at := 0, int64(0); at < int64(len(p)); i++ {
		n := min(4096, int64(len(p))-at)
		piece := mem[off+at : off+at+n]
		if i%3 == 2 {
			piece = p[at : at+n]
			copy(piece, mem[off+at:])
		}
		v = append(v, piece)
		at += n
	}
	d.mapped.Add(1)
	d.held.Add(1)
	return v, true
}

func (d *mappedDevice) ReleaseMapped() {
	if d.held.Add(-1) < 0 {
		panic("ReleaseMapped without a ReadMapped")
	}
}

// TestMappedReads: with MappedReads on, READ replies (simple and structured, many in flight so
// that they are coalesced) are written from the device's slices, byte for byte; refused reads
// fall back to ReadAt; every mapped read is released once; with the option off the device is
// never asked.
func TestMappedReads(t *testing.T) {
	for _, tc := range []struct {
		name       string
		on         bool
		structured bool
	}{{"simple", true, false}, {"structured", true, true}, {"off", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			model := pattern(11, testSize)
			dev := &mappedDevice{MemDevice: nbdtest.NewMemDevice(testSize), mem: model}
			if _, err := dev.WriteAt(model, 0); err != nil {
				t.Fatal(err)
			}
			s, _ := testServer(t, Options{Exports: []Export{{Name: "disk", Device: dev, MappedReads: tc.on}}})
			c, done := unixConn(t, s)
			if tc.structured {
				c.structuredGo("disk", false)
			} else {
				c.handshakeGo("disk")
			}
			type rd struct{ off, n uint64 }
			var reads []rd
			for i := range uint64(40) {
				reads = append(reads, rd{(i * 5 * 1024) % (testSize - 256<<10), 512 * (1 + (i*7919)%512)})
			}
			for i, r := range reads {
				c.request(wire.CmdRead, 0, uint64(100+i), r.off, uint32(r.n), nil)
			}
			for range reads {
				var cookie uint64
				var payload []byte
				if tc.structured {
					ch := c.chunk()
					if ch.typ != wire.ReplyTypeOffsetData {
						t.Fatalf("READ reply type %#x, want OFFSET_DATA", ch.typ)
					}
					cookie, payload = ch.cookie, ch.payload[8:]
				} else {
					errno, ck := c.reply()
					if errno != 0 {
						t.Fatalf("READ %d: errno %d", ck, errno)
					}
					i := int(ck) - 100
					cookie, payload = ck, c.read(int(reads[i].n))
				}
				r := reads[int(cookie)-100]
				if j := firstDiff(payload, model[r.off:r.off+r.n]); j >= 0 || uint64(len(payload)) != r.n {
					t.Fatalf("READ at %d of %d: %d bytes, differs at byte %d", r.off, r.n, len(payload), j)
				}
			}
			c.nc.Close()
			<-done
			if dev.held.Load() != 0 {
				t.Errorf("%d mapped reads never released", dev.held.Load())
			}
			switch {
			case tc.on && (dev.mapped.Load() == 0 || dev.refused.Load() == 0):
				t.Errorf("mapped %d, refused %d: want both paths taken", dev.mapped.Load(), dev.refused.Load())
			case !tc.on && dev.mapped.Load()+dev.refused.Load() != 0:
				t.Errorf("MappedReads off, but the device was asked %d times", dev.mapped.Load()+dev.refused.Load())
			}
		})
	}
}
