package member_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

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

// TestTouchRemaps: a mapping is replaced once it has touched RemapRegions page-table regions,
// not for the bytes that go through it: a client that keeps writing the same few hundred MiB
// must not have the mappings pulled from under it (each replacement refaults every page).
func TestTouchRemaps(t *testing.T) {
	R := int64(member.PtRegion)
	m, path := openSparse(t, t.TempDir(), (member.RemapRegions+8)*R)
	p := pattern(8192, 9)
	if _, err := m.WriteAt(p, 3*R-4096); err != nil { // across a region boundary
		t.Fatal(err)
	}
	mp := m.Mapping()
	if mp == nil {
		t.Skip("the file could not be mapped")
	}
	// 64 GiB through 32 regions: never replaced.
	for range 1024 {
		if err := m.Touch(0, 32*R); err != nil {
			t.Fatal(err)
		}
		if err := m.Touch(5*R+100, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if n := member.Remaps(m); n != 0 {
		t.Fatalf("touching the same 32 regions over and over replaced the mapping %d times", n)
	}
	// The rest, one region at a time: replaced at the RemapRegions-th distinct region.
	for r := int64(32); r < member.RemapRegions-1; r++ {
		if err := m.Touch(r*R, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := member.Remaps(m); n != 0 {
		t.Fatalf("replaced after %d of %d regions", member.RemapRegions-1, member.RemapRegions)
	}
	if err := m.Touch((member.RemapRegions-1)*R, 2*R); err != nil { // two more: the bound and one
		t.Fatal(err)
	}
	if n := member.Remaps(m); n != 1 {
		t.Fatalf("after %d regions the mapping was replaced %d times, want 1", member.RemapRegions+1, n)
	}
	// Forgotten with the old mapping: touching them again starts the count afresh.
	for r := int64(0); r < member.RemapRegions/2; r++ {
		if err := m.Touch(r*R, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := member.Remaps(m); n != 1 {
		t.Fatalf("the count was not reset by the replacement (%d replacements)", n)
	}
	// The new mapping shows the file: what was written before, and what is written now.
	if !bytes.Equal(mp[3*R-4096:3*R+4096], p) {
		t.Fatal("the replaced mapping does not show the file's bytes")
	}
	q := pattern(4096, 3)
	if _, err := m.WriteAt(q, 7*R); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mp[7*R:7*R+4096], q) {
		t.Fatal("the replaced mapping does not show a later write")
	}
	readBack(t, path, 3*R-4096, p)
}

// TestWritableRangeRemembers: what WritableRange learns from mincore (a 1 MiB region wholly in
// memory) is forgotten when the region can hold a hole again: the file's own Trim punches one,
// or the file is found shorter (Covers) — cut and grown back from outside, it has holes. A
// region only partly in memory is not remembered, and its pages are answered one by one.
func TestWritableRangeRemembers(t *testing.T) {
	const M = 1 << 20
	m, path := openSparse(t, shmDir(t), 4*M)
	if _, err := m.WriteAt(pattern(2*M, 1), M); err != nil { // regions 1 and 2 in memory
		t.Fatal(err)
	}
	if _, err := m.WriteAt(pattern(8192, 2), 3*M); err != nil { // region 3 in part
		t.Fatal(err)
	}
	if m.WritableRange(M+4096, 8192) == nil || m.WritableRange(2*M+M/2, 4096) == nil {
		t.Fatal("WritableRange refused pages in memory")
	}
	if m.WritableRange(3*M, 8192) == nil {
		t.Fatal("WritableRange refused the pages in memory of a region in part")
	}
	if m.WritableRange(3*M, 3*4096) != nil || m.WritableRange(3*M+8192, 4096) != nil {
		t.Fatal("WritableRange handed out a hole of a region in memory in part")
	}
	// The file's own Trim: the hole is refused, in a region known to be in memory.
	if err := m.Trim(M+64<<10, 8192); err != nil {
		t.Fatal(err)
	}
	if m.WritableRange(M+64<<10, 4096) != nil {
		t.Fatal("WritableRange handed out a hole punched by Trim in a region it had found in memory")
	}
	// Cut short from outside (Covers, as a placed write's commit does, finds it short), then
	// grown back: holes where region 2 was, refused.
	if err := os.Truncate(path, 2*M); err != nil {
		t.Fatal(err)
	}
	if m.Covers(4 * M) {
		t.Fatal("Covers(4 MiB) of a 2 MiB file")
	}
	if err := os.Truncate(path, 4*M); err != nil {
		t.Fatal(err)
	}
	if m.WritableRange(2*M+M/2, 4096) != nil {
		t.Fatal("WritableRange handed out a hole left by a cut the file's size check saw")
	}
}

// TestWritableRangePopulates: a region WritableRange finds wholly in memory has its pages mapped
// in one call (MADV_POPULATE_READ), so that the stores into it do not fault page by page (525k
// minor faults in 5 s of 48 KiB placed writes before, 34k after); a region in memory in part is
// not populated: its holes stay unmapped and unallocated (a populate would allocate them on
// tmpfs). Its pages in memory may be mapped by the kernel's fault-around of the last faults in
// the region before it (a window aligned in the address space, not in the file), so they are
// not counted. Whether a page of the mapping is mapped is read from /proc/self/pagemap.
func TestWritableRangePopulates(t *testing.T) {
	const M = 1 << 20
	m, path := openSparse(t, shmDir(t), 4*M)
	if _, err := m.WriteAt(pattern(M, 1), M); err != nil { // region 1 in memory
		t.Fatal(err)
	}
	if _, err := m.WriteAt(pattern(M/2, 2), 2*M); err != nil { // region 2 in part: a hole from 2.5 MiB
		t.Fatal(err)
	}
	blocks := func() int64 {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks
	}
	b0 := blocks()
	mp := m.Mapping()
	if n := mappedPages(t, mp[M:3*M]); n != 0 {
		t.Fatalf("%d pages mapped before any use of the mapping", n)
	}
	if m.WritableRange(M+4096, 8192) == nil || m.WritableRange(2*M, 8192) == nil {
		t.Fatal("WritableRange refused pages in memory")
	}
	if n := mappedPages(t, mp[M:2*M]); n != M/4096 {
		t.Errorf("%d of %d pages of the region found in memory mapped; want all", n, M/4096)
	}
	if n := mappedPages(t, mp[2*M+M/2:3*M]); n != 0 {
		t.Errorf("%d pages of the hole of a region in memory in part mapped; want none", n)
	}
	if b := blocks(); b != b0 {
		t.Errorf("the file's blocks went from %d to %d: a hole was allocated", b0, b)
	}
}

// mappedPages counts the pages of b (page aligned) present in this process's page tables.
func mappedPages(t *testing.T, b []byte) int {
	t.Helper()
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	first := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) / 4096
	ents := make([]byte, len(b)/4096*8)
	if _, err := f.ReadAt(ents, int64(first*8)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 0; i < len(ents); i += 8 {
		if binary.LittleEndian.Uint64(ents[i:])&(1<<63) != 0 {
			n++
		}
	}
	return n
}
