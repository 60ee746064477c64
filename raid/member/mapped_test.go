package member_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
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

// TestWriteMapped: on tmpfs every write goes through the mapping and lands in the file (read
// back with pread, every byte); on a disk's filesystem a page not in the page cache is
// declined (nothing written) and one that is taken; a read-only member declines.
func TestWriteMapped(t *testing.T) {
	t.Run("tmpfs", func(t *testing.T) {
		m, path := openSparse(t, shmDir(t), 1<<20)
		p := pattern(3*4096+123, 1)
		if !m.WriteMapped(p, 4096+77) {
			t.Fatal("WriteMapped declined a write into a tmpfs file")
		}
		readBack(t, path, 4096+77, p)
		bufs := [][]byte{pattern(16<<10, 2), pattern(100, 3), pattern(8192, 4)}
		if !m.WritevMapped(bufs, 200<<10) {
			t.Fatal("WritevMapped declined a write into a tmpfs file")
		}
		readBack(t, path, 200<<10, bytes.Join(bufs, nil))
		if m.WriteMapped(p, 1<<20-100) {
			t.Fatal("WriteMapped took a write past the member's end")
		}
	})
	t.Run("disk", func(t *testing.T) {
		dir := t.TempDir()
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
			t.Skip("the temporary directory is on tmpfs")
		}
		m, path := openSparse(t, dir, 1<<20)
		p := pattern(8192, 5)
		// Evict the file's pages: a fresh sparse file has none cached, but be sure.
		if err := unix.Fadvise(fdOf(t, path), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		if m.WriteMapped(p, 64<<10) {
			t.Fatal("WriteMapped took a write to pages not in the page cache")
		}
		readBack(t, path, 64<<10, make([]byte, len(p)))                    // declined: nothing written
		if _, err := m.WriteAt(make([]byte, len(p)), 64<<10); err != nil { // now cached
			t.Fatal(err)
		}
		if !m.WriteMapped(p, 64<<10) {
			t.Fatal("WriteMapped declined a write to pages in the page cache")
		}
		readBack(t, path, 64<<10, p)
		if err := m.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fadvise(fdOf(t, path), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		readBack(t, path, 64<<10, p) // from the disk: Sync wrote back the mapped write
	})
	t.Run("read-only", func(t *testing.T) {
		dir := shmDir(t)
		path := filepath.Join(dir, "m.img")
		if err := member.CreateFile(path, 1<<20); err != nil {
			t.Fatal(err)
		}
		m, err := member.OpenFile(path, member.Shared)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if m.WriteMapped(pattern(4096, 6), 0) {
			t.Fatal("WriteMapped wrote to a member opened read-only")
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

// TestWriteMappedTruncated: a member file truncated under the array. A write wholly past the
// new end faults and one into the page the new end falls in (which takes stores past the end
// without a fault, never written to the file) is caught by the size check: both are declined,
// and pwrite then writes them, as it would have without the mapping.
func TestWriteMappedTruncated(t *testing.T) {
	m, path := openSparse(t, shmDir(t), 1<<20)
	before := pattern(8192, 7)
	if !m.WriteMapped(before, 0) {
		t.Fatal("WriteMapped declined")
	}
	const end = 8192 + 100
	if err := os.Truncate(path, end); err != nil {
		t.Fatal(err)
	}
	p := pattern(200, 8)
	if m.WriteMapped(p, end+50) {
		t.Fatal("WriteMapped took a write past the end of a truncated file, within its last page")
	}
	if m.WriteMapped(p, 64<<10) {
		t.Fatal("WriteMapped took a write to pages past the end of a truncated file")
	}
	if st, err := os.Stat(path); err != nil || st.Size() != end {
		t.Fatalf("size after declined writes: %v, %v; want %d", st.Size(), err, end)
	}
	readBack(t, path, 0, before)
	if _, err := m.WriteAt(p, end+50); err != nil { // what the array does next
		t.Fatal(err)
	}
	readBack(t, path, end+50, p)
}

// TestWriteMappedFull: holes of a file on a full tmpfs cannot be filled: the mapped write
// faults, is declined, and pwrite reports ENOSPC. Needs root (mount).
func TestWriteMappedFull(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "raid5d-test", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	m, _ := openSparse(t, dir, 1<<20)
	p := pattern(64<<10, 9)
	var off int64
	for ; off < 1<<20; off += int64(len(p)) {
		if !m.WriteMapped(p, off) {
			break
		}
	}
	if off >= 1<<20 {
		t.Fatal("a 256 KiB tmpfs took 1 MiB of mapped writes")
	}
	if _, err := m.WriteAt(p, off); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("pwrite after the declined mapped write: %v, want ENOSPC", err)
	}
}
