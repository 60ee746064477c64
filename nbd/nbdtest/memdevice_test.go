package nbdtest

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestMemDevice(t *testing.T) {
	d := NewMemDevice(8192)
	if n, err := d.WriteAt([]byte("hello"), 4090); n != 5 || err != nil {
		t.Fatalf("WriteAt = %d, %v", n, err)
	}
	p := make([]byte, 10)
	if n, err := d.ReadAt(p, 4088); n != 10 || err != nil || !bytes.Equal(p, []byte("\x00\x00hello\x00\x00\x00")) {
		t.Fatalf("ReadAt = %d, %v, %q", n, err, p)
	}
	if n, err := d.ReadAt(p, 8190); n != 2 || !errors.Is(err, io.EOF) {
		t.Errorf("ReadAt across the end = %d, %v; want 2, EOF", n, err)
	}
	if _, err := d.WriteAt(p, 8190); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("WriteAt across the end: %v, want ErrOutOfRange", err)
	}
	if err := d.Trim(4088, 4); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteZeroes(4092, 2, true); err != nil {
		t.Fatal(err)
	}
	if got := d.Bytes()[4088:4096]; !bytes.Equal(got, []byte("\x00\x00\x00\x00\x00\x00o\x00")) {
		t.Errorf("after Trim and WriteZeroes: %q", got)
	}
	injected := errors.New("injected")
	d.Fail = func(op Op, off, n int64) error {
		if op == OpFlush {
			return injected
		}
		return nil
	}
	if err := d.Flush(); !errors.Is(err, injected) {
		t.Errorf("Flush = %v, want injected", err)
	}
	if st := d.Stats(); st.Writes != 2 || st.Reads != 2 || st.Trims != 1 || st.WriteZeroes != 1 || st.NoHole != 1 || st.Flushes != 1 {
		t.Errorf("Stats = %+v", st)
	}
}
