package member_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/raid5d/raid5d/raid/member"
)

func TestFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.img")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	m, err := member.OpenFile(path, member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Size() != 1<<20 || m.Name() != path {
		t.Fatalf("Size %d Name %q", m.Size(), m.Name())
	}
	data := bytes.Repeat([]byte{7}, 3*4096)
	if n, err := m.WriteAt(data, 4096); err != nil || n != len(data) {
		t.Fatalf("WriteAt = %d, %v", n, err)
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := m.Trim(8192, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := m.ReadAt(got, 4096); err != nil {
		t.Fatal(err)
	}
	clear(data[4096:8192])
	if !bytes.Equal(got, data) {
		t.Fatal("after Trim the range must read as zeroes and the rest be intact")
	}
	if n, err := m.ReadAt(got, 1<<20-100); n != 100 || !errors.Is(err, io.EOF) {
		t.Fatalf("read across the end = %d, %v; want 100, EOF", n, err)
	}
	if _, err := m.WriteAt(got, 1<<20-100); err == nil {
		t.Fatal("a write past the member's end must fail")
	}
	if err := m.Trim(1<<20-100, 200); err == nil {
		t.Fatal("a trim past the member's end must fail")
	}

	if _, err := member.OpenFile(path, member.Shared); !errors.Is(err, member.ErrBusy) {
		t.Fatalf("read-only open beside a read-write one: %v, want ErrBusy", err)
	}
	m.Close()
	ro, err := member.OpenFile(path, member.Shared)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.WriteAt(got[:10], 0); err == nil {
		t.Fatal("a read-only member accepted a write")
	}
	for _, bad := range []string{t.TempDir(), "/dev/null", filepath.Join(t.TempDir(), "absent")} {
		if m, err := member.OpenFile(bad, member.Shared); err == nil {
			m.Close()
			t.Errorf("OpenFile(%s) succeeded; want an error", bad)
		}
	}
	if _, err := member.OpenFile(filepath.Join(t.TempDir(), "absent"), member.Shared); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent member: %v, want ErrNotExist", err)
	}
}

// TestWriteGrowsTruncated: a write that would grow a file truncated under the array back towards
// its size is ErrShrunk (refused before it writes where the file has its tail mapping, else
// found after it: the member is failed with it), and a write that would
// grow it back whole, to Size, is refused before it writes, for each of WriteAt, WritevAt and
// WriteAtDSync, buffered and direct. A write within the new end is not refused (the flush's size
// check fails the member), nor is any write to a file of its full size.
func TestWriteGrowsTruncated(t *testing.T) {
	const size, cut = 1 << 20, 1 << 19
	writes := map[string]func(m *member.File, p []byte, off int64) (int, error){
		"WriteAt":      (*member.File).WriteAt,
		"WriteAtDSync": (*member.File).WriteAtDSync,
		"WritevAt": func(m *member.File, p []byte, off int64) (int, error) {
			return m.WritevAt([][]byte{p[:4096], p[4096:]}, off, nil)
		},
	}
	for _, direct := range []member.Direct{member.DirectOff, member.DirectOn} {
		for name, write := range writes {
			t.Run(direct.String()+"/"+name, func(t *testing.T) {
				member.SetDirect(direct)
				defer member.SetDirect(member.DirectOff)
				path := filepath.Join(t.TempDir(), "m.img")
				if err := member.CreateFile(path, size); err != nil {
					t.Fatal(err)
				}
				m, err := member.OpenFile(path, member.Exclusive)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if d, _ := m.Direct(); d != (direct == member.DirectOn) {
					t.Fatalf("opened with direct I/O %v under %v", d, direct)
				}
				p := bytes.Repeat([]byte{9}, 8192)
				if _, err := write(m, p, size-8192); err != nil { // whole: at Size, fine
					t.Fatalf("write at the end of a whole file: %v", err)
				}
				if err := os.Truncate(path, cut); err != nil {
					t.Fatal(err)
				}
				if _, err := write(m, p, cut-3*8192); err != nil {
					t.Fatalf("write within the new end: %v", err)
				}
				if _, err := write(m, p, cut+65536); !errors.Is(err, member.ErrShrunk) {
					t.Fatalf("write that would grow the truncated file: %v; want ErrShrunk", err)
				}
				// Refused before it wrote where the file has its tail mapping (the file still
				// cut), else found after (the file grown by it).
				fi, err := os.Stat(path)
				if err != nil || fi.Size() != cut && fi.Size() != cut+65536+8192 {
					t.Fatalf("after the growing write: %v, %v; want %d (refused) or %d (written)", fi.Size(), err, cut, cut+65536+8192)
				}
				was := fi.Size()
				if n, err := write(m, p, size-8192); !errors.Is(err, member.ErrShrunk) || n != 0 {
					t.Fatalf("write that would grow the file back whole: %d, %v; want 0, ErrShrunk", n, err)
				}
				if fi, err := os.Stat(path); err != nil || fi.Size() != was {
					t.Fatalf("after the refused write: %v, %v; want the file unchanged", fi.Size(), err)
				}
			})
		}
	}
}
