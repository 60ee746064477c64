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
