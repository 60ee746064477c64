package main

import (
	"path/filepath"
	"testing"

	"github.com/raid5d/raid5d/nbd"
	"github.com/raid5d/raid5d/raid"
)

// TestArrayDeviceBlockStatus checks the translation of the array's holes into NBD's flags on a
// real array of files: a written block is data, the rest of its stripe and the array holes.
func TestArrayDeviceBlockStatus(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "m0"), filepath.Join(dir, "m1"), filepath.Join(dir, "m2")}
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: 64 << 10, MemberSize: raid.DataOffset + 1<<20,
		IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	size, _ := a.Size()
	d := arrayDevice{a}
	hz := nbd.ExtentHole | nbd.ExtentZero
	ext, err := d.BlockStatus(0, size, make([]nbd.Extent, 0, 16))
	if err != nil || len(ext) != 1 || ext[0] != (nbd.Extent{Length: size, Flags: hz}) {
		t.Fatalf("fresh array: %+v, %v; want one hole of %d", ext, err, size)
	}
	const off = 256 << 10
	block := make([]byte, 4096)
	for i := range block {
		block[i] = byte(i) | 1
	}
	if _, err := a.WriteAt(block, off); err != nil {
		t.Fatal(err)
	}
	ext, err = d.BlockStatus(0, size, make([]nbd.Extent, 0, 16))
	want := []nbd.Extent{{Length: off, Flags: hz}, {Length: 4096}, {Length: size - off - 4096, Flags: hz}}
	if err != nil || len(ext) != len(want) {
		t.Fatalf("after a write at %d: %+v, %v; want %+v", off, ext, err, want)
	}
	for i := range want {
		if ext[i] != want[i] {
			t.Fatalf("after a write at %d: %+v; want %+v", off, ext, want)
		}
	}
	// The array honours cap(dst): one extent asked, one given (NBD_CMD_FLAG_REQ_ONE).
	ext, err = d.BlockStatus(0, size, make([]nbd.Extent, 0, 1))
	if err != nil || len(ext) != 1 || ext[0] != (nbd.Extent{Length: off, Flags: hz}) {
		t.Fatalf("one extent: %+v, %v", ext, err)
	}
}
