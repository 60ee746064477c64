package member_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/raid5d/raid5d/raid/member"
	"golang.org/x/sys/unix"
)

// shmDir returns a temporary directory on tmpfs, or skips.
func shmDir(t *testing.T) string {
	t.Helper()
	var fs unix.Statfs_t
	if unix.Statfs("/dev/shm", &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skip("no tmpfs at /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "raid5d-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// openSparse creates a sparse file of size bytes in dir and opens it as a member for writing.
func openSparse(t *testing.T, dir string, size int64) (*member.File, string) {
	t.Helper()
	path := filepath.Join(dir, "m.img")
	if err := member.CreateFile(path, size); err != nil {
		t.Fatal(err)
	}
	m, err := member.OpenFile(path, member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, path
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7) + byte(i>>9)
	}
	return p
}

// readBack reads n bytes at off of the file at path with its own descriptor (pread, not the
// mapping) and compares them with want.
func readBack(t *testing.T, path string, off int64, want []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%d bytes at %d: file differs from what was written", len(want), off)
	}
}

// TestWritableRange: the writable range a placed write stores into is handed out only where
// every page is in memory (a tmpfs hole is not: a store there would allocate, and fault on a
// full tmpfs); what is stored into it is in the file (read back with pread, every byte); a
// member opened read-only has none; Covers sees a truncation.
func TestWritableRange(t *testing.T) {
	for _, dir := range []string{"tmpfs", "disk"} {
		t.Run(dir, func(t *testing.T) {
			d := t.TempDir()
			if dir == "tmpfs" {
				d = shmDir(t)
			}
			m, path := openSparse(t, d, 1<<20)
			if r := m.WritableRange(64<<10, 8192); r != nil {
				t.Fatal("WritableRange handed out pages not in memory (a hole)")
			}
			if _, err := m.WriteAt(make([]byte, 8192), 64<<10); err != nil { // now in memory
				t.Fatal(err)
			}
			r := m.WritableRange(64<<10, 8192)
			if len(r) != 8192 {
				t.Fatalf("WritableRange of resident pages = %d bytes, want 8192", len(r))
			}
			p := pattern(8192, 5)
			copy(r, p)
			readBack(t, path, 64<<10, p)
			if err := m.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := unix.Fadvise(fdOf(t, path), 0, 0, unix.FADV_DONTNEED); err != nil {
				t.Fatal(err)
			}
			readBack(t, path, 64<<10, p) // Sync wrote back the pages stored through the mapping
			if m.WritableRange(1<<20-4096, 8192) != nil {
				t.Fatal("WritableRange past the member's end")
			}
			if !m.Covers(1<<20) || m.Covers(1<<20+1) {
				t.Fatal("Covers is wrong for the file's own size")
			}
			if err := os.Truncate(path, 8192+100); err != nil {
				t.Fatal(err)
			}
			if m.Covers(64<<10 + 8192) {
				t.Fatal("Covers missed a truncation")
			}
		})
	}
	t.Run("read-only", func(t *testing.T) {
		path := filepath.Join(shmDir(t), "m.img")
		if err := member.CreateFile(path, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil { // resident
			t.Fatal(err)
		}
		m, err := member.OpenFile(path, member.Shared)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if m.WritableRange(0, 4096) != nil {
			t.Fatal("WritableRange of a member opened read-only")
		}
	})
}

// fdOf opens path for fadvise; the descriptor is closed at the end of the test.
func fdOf(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}
