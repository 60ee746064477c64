package member

import (
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
	path := filepath.Join(t.TempDir(), "m.img")
	const size = 1<<20 + 512 // not a whole number of pages
	if err := CreateFile(path, size); err != nil {
		t.Fatal(err)
	}
	m, err := OpenFile(path, Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
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
