package member

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkSizeGuard: what the check after each write to a file costs, as guardWrite makes it
// (a load from the tail mapping) and as an fstat would.
func BenchmarkSizeGuard(b *testing.B) {
	path := filepath.Join(b.TempDir(), "m.img")
	if err := CreateFile(path, 64<<20); err != nil {
		b.Fatal(err)
	}
	m, err := OpenFile(path, Exclusive)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	if m.tail == nil {
		b.Fatal("no tail mapping")
	}
	b.Run("tail-load", func(b *testing.B) {
		for b.Loop() {
			if !m.reachesTail() {
				b.Fatal("a whole file does not reach its tail")
			}
		}
	})
	b.Run("fstat", func(b *testing.B) {
		for b.Loop() {
			if now, err := m.sizeNow(); err != nil || now != m.size {
				b.Fatal(now, err)
			}
		}
	})
	_ = os.Remove(path)
}

// TestReachesTail: the tail load says a file reaches its last page until a truncation cuts it
// below that page (a fault, caught), and again once the file has grown back into it; a cut
// within the last page leaves it reaching.
func TestReachesTail(t *testing.T) {
	const size = 1<<20 + 512 // not a whole number of pages
	m, path := openTestFile(t, size)
	if m.tail == nil || m.tailOff != 1<<20 {
		t.Fatalf("tail mapping %v at %d; want one at %d", m.tail != nil, m.tailOff, 1<<20)
	}
	for _, c := range []struct {
		size  int64
		reach bool
	}{{size, true}, {1<<20 + 1, true}, {1 << 20, false}, {4096, false}, {0, false}, {size, true}} {
		if err := os.Truncate(path, c.size); err != nil {
			t.Fatal(err)
		}
		if got := m.reachesTail(); got != c.reach {
			t.Errorf("file of %d bytes (last page at %d): reachesTail %v; want %v", c.size, m.tailOff, got, c.reach)
		}
	}
}

// TestReadGrownBack: a file truncated under the array and grown back by one of the array's
// writes past its new end holds a hole that reads as zeroes; once the write guard has found
// it, reads of it (ReadAt, ReadvAt, CopyMapped) must not return those zeroes as the member's
// data: ErrShortRead (or false), so the array reconstructs the range until the member is
// failed with that write.
func TestReadGrownBack(t *testing.T) {
	const size = 4 << 20
	m, path := openTestFile(t, size)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i%251 + 1)
	}
	if _, err := m.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	m.Touch(0, size)
	if err := os.Truncate(path, size/4); err != nil {
		t.Fatal(err)
	}
	// The array's own write past the cut grows the file back to size/2 + 4 KiB: the guard
	// finds it (ErrShrunk) and the member's reads are refused from then on.
	if _, err := m.WriteAt(data[size/2:size/2+4096], size/2); !errors.Is(err, ErrShrunk) {
		t.Fatalf("write growing the cut file back: %v, want ErrShrunk", err)
	}
	if fi, err := os.Stat(path); err != nil || m.tail == nil || fi.Size() != size/4 {
		t.Fatalf("after the refused write: size %v (%v), tail mapping %v; want %d, refused before it wrote", fi.Size(), err, m.tail != nil, size/4)
	}
	// Had it written (a truncation between the guard's load and the write), the guard after
	// it would have found the file grown: its reads are refused then too.
	m.grown.Store(true)
	p := make([]byte, 8192)
	for _, off := range []int64{size / 4, size/2 - 8192, size / 3} {
		if n, err := m.ReadAt(p, off); !errors.Is(err, ErrShortRead) {
			t.Errorf("ReadAt of the hole at %d: %d bytes, %v; want ErrShortRead", off, n, err)
		}
		if n, err := m.ReadvAt([][]byte{p[:4096], p[4096:]}, off, nil); !errors.Is(err, ErrShortRead) {
			t.Errorf("ReadvAt of the hole at %d: %d bytes, %v; want ErrShortRead", off, n, err)
		}
		if m.CopyMapped(p, off) {
			t.Errorf("CopyMapped of the hole at %d: true (zeroes as data)", off)
		}
	}
	if m.CopyMapped(p, size/2-4096) { // ends in the grown-back write's data, not zero
		t.Errorf("CopyMapped across the hole's end: true")
	}
}

// openTestFile creates a member file of size bytes and opens it for exclusive use, closed at
// the test's end.
func openTestFile(t *testing.T, size int64) (*File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.img")
	if err := CreateFile(path, size); err != nil {
		t.Fatal(err)
	}
	m, err := OpenFile(path, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, path
}
