package nbdtest

import (
	"bytes"
	"errors"
	"testing"
)

func TestPinnedDevice(t *testing.T) {
	d := NewPinnedDevice(8192)
	released := 0
	p := bytes.Repeat([]byte{7}, 4096)
	if n, err := d.WritePinned(p, 4096, func() { released++ }); n != 4096 || err != nil {
		t.Fatalf("WritePinned = %d, %v", n, err)
	}
	if got := d.Bytes()[4096:]; !bytes.Equal(got, p) {
		t.Fatal("WritePinned did not write at once")
	}
	if h := d.Held(); len(h) != 1 || h[0].Off != 4096 || released != 0 {
		t.Fatalf("held %v, released %d; want the buffer held", h, released)
	}
	if err := d.Err(); err != nil {
		t.Fatalf("no violation yet: %v", err)
	}
	// The server's mistakes, made on purpose: reuse the held buffer, then change it.
	d.ReadAt(p[:512], 0)
	if err := d.Err(); !errors.Is(err, ErrHeldBufferReused) {
		t.Errorf("ReadAt into a held buffer: Err = %v, want ErrHeldBufferReused", err)
	}
	p[100] = 8
	if !d.Release(nil) || released != 1 || d.Release(nil) {
		t.Fatalf("Release: %d release calls, want exactly 1", released)
	}
	if err := d.Err(); !errors.Is(err, ErrHeldBufferChanged) {
		t.Errorf("changed before release: Err = %v, want ErrHeldBufferChanged", err)
	}
	d.Hold = func(off, n int64) bool { return false }
	d.WritePinned(p, 0, func() { released++ })
	if released != 2 || len(d.Held()) != 0 || d.Pins() != 2 || d.Releases() != 2 {
		t.Errorf("Hold false: released %d, held %d, pins %d, releases %d; want the buffer released at once",
			released, len(d.Held()), d.Pins(), d.Releases())
	}
}
