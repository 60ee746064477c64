package member

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestVectored checks preadv/pwritev on a real file member against the same bytes written
// and read one buffer at a time: buffers of odd sizes (empty ones included), a read that runs
// past the end of a file shorter than the member (zeroes, then EOF), and too many buffers.
func TestVectored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.img")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const size = 1 << 20
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	m, err := OpenFile(path, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{4096, 0, 1, 16 << 10, 511, 0, 65536, 3}
	var bufs [][]byte
	total := 0
	for _, n := range sizes {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		bufs = append(bufs, b)
		total += n
	}
	want := bytes.Join(bufs, nil)
	iov := make([]unix.Iovec, 0, len(bufs))
	const off = 12345
	if n, err := m.WritevAt(bufs, off, iov); err != nil || n != total {
		t.Fatalf("WritevAt = %d, %v; want %d", n, err, total)
	}
	got := make([]byte, total)
	if _, err := m.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("ReadAt after WritevAt: %v, equal %v", err, bytes.Equal(got, want))
	}
	// Read back into differently cut buffers.
	cut := [][]byte{got[:7], got[7:7], got[7:40000], got[40000:]}
	clear(got)
	if n, err := m.ReadvAt(cut, off, iov); err != nil || n != total || !bytes.Equal(got, want) {
		t.Fatalf("ReadvAt = %d, %v, equal %v", n, err, bytes.Equal(got, want))
	}
	// The generic paths (members without preadv) give the same bytes.
	clear(got)
	if n, err := Readv(struct{ Member }{m}, cut, off, iov); err != nil || n != total || !bytes.Equal(got, want) {
		t.Fatalf("readv without Vectored = %d, %v, equal %v", n, err, bytes.Equal(got, want))
	}

	// A file shorter than the member (truncated behind its back): ErrShortRead at the file's
	// end, never zeroes up to Size.
	if err := os.Truncate(path, size-100); err != nil {
		t.Fatal(err)
	}
	tail := [][]byte{make([]byte, 50), make([]byte, 100), make([]byte, 50)}
	for _, b := range tail {
		for i := range b {
			b[i] = 0xff
		}
	}
	n, err := m.ReadvAt(tail, size-150, iov)
	if n != 50 || !errors.Is(err, ErrShortRead) || errors.Is(err, io.EOF) {
		t.Fatalf("ReadvAt across the file's end = %d, %v; want 50, ErrShortRead", n, err)
	}
	if n, err := Readv(struct{ Member }{m}, tail, size-150, iov); n != 50 || !errors.Is(err, ErrShortRead) {
		t.Fatalf("readv without Vectored across the file's end = %d, %v; want 50, ErrShortRead", n, err)
	}
	if _, err := m.WritevAt(tail, size-150, iov); err == nil {
		t.Fatal("a write past the member's end must fail")
	}
	if _, err := m.ReadvAt(make([][]byte, MaxIov+1), 0, iov); err == nil {
		t.Fatal("more than MaxIov buffers must be refused")
	}
}
