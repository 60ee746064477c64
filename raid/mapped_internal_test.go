package raid

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCopyMappedFault: a copy from a member's mapping that faults (here: the file was cut
// short under the mapping, as a read error would fault) reports false instead of crashing the
// process, and the array's member read then falls back to pread, which reports the short file
// (ErrShortRead, never zeroes); a copy that does not fault returns the bytes.
func TestCopyMappedFault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.img")
	want := bytes.Repeat([]byte("raid5d-mapped!"), 1<<16) // 896 KiB
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	mem, err := OpenMember(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	fm := mem.(*fileMember)
	p := make([]byte, 8192)
	if !fm.CopyMapped(p, 4096) || !bytes.Equal(p, want[4096:4096+8192]) {
		t.Fatalf("copy from the mapping: wrong bytes or refused")
	}
	if fm.CopyMapped(p, int64(len(want))-4096) {
		t.Fatalf("copy past the member's end: not refused")
	}
	if err := os.Truncate(path, 64<<10); err != nil {
		t.Fatal(err)
	}
	if fm.CopyMapped(p, 512<<10) {
		t.Fatalf("copy of a page past the end of the cut file: no fault reported")
	}
	a := &Array{mapReads: true}
	m := &member{Member: fm}
	clear(p)
	p[0] = 1
	if n, err := a.readMember(m, p, 512<<10); n != 0 || !errors.Is(err, ErrShortRead) {
		t.Fatalf("readMember after the fault = %d, %v; want 0, ErrShortRead", n, err)
	}
	if !fm.CopyMapped(p, 4096) || !bytes.Equal(p, want[4096:4096+8192]) {
		t.Fatalf("copy within the cut file after a fault: wrong bytes or refused")
	}
}
