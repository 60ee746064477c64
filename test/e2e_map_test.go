package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// mapExtent is one entry of `nbdinfo --map --json` or `qemu-img map --output=json`, reduced to
// what both say: the range and whether it is a hole that reads as zeroes.
type mapExtent struct {
	Off, Len int64
	Hole     bool
}

func (e mapExtent) String() string {
	kind := "data"
	if e.Hole {
		kind = "hole"
	}
	return fmt.Sprintf("[%d,+%d) %s", e.Off, e.Len, kind)
}

// nbdinfoMap runs `nbdinfo --map --json` (base:allocation through NBD_CMD_BLOCK_STATUS) and
// returns its extents with neighbours of the same kind merged. A hole must also be zero.
func nbdinfoMap(t *testing.T, uri string) []mapExtent {
	t.Helper()
	out := runTool(t, "nbdinfo", "--map", "--json", uri)
	var raw []struct {
		Offset, Length int64
		Type           uint32
		Description    string
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("nbdinfo --map --json: %v\n%s", err, out)
	}
	var ext []mapExtent
	for _, r := range raw {
		if r.Type&1 != 0 && r.Type&2 == 0 {
			t.Fatalf("nbdinfo --map: a hole that is not zero: %+v", r)
		}
		ext = appendExtent(ext, mapExtent{r.Offset, r.Length, r.Type&1 != 0})
	}
	return ext
}

// qemuImgMap runs `qemu-img map --output=json` on the export and returns its extents, merged.
// qemu-img reports "data": false for ranges the server calls holes, and "zero": true for those
// that read as zeroes; a range is a hole here when both say so.
func qemuImgMap(t *testing.T, uri string) []mapExtent {
	t.Helper()
	out := runTool(t, "qemu-img", "map", "-f", "raw", "--output=json", uri)
	var raw []struct {
		Start, Length int64
		Data, Zero    bool
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("qemu-img map --output=json: %v\n%s", err, out)
	}
	var ext []mapExtent
	for _, r := range raw {
		ext = appendExtent(ext, mapExtent{r.Start, r.Length, !r.Data && r.Zero})
	}
	return ext
}

func appendExtent(ext []mapExtent, e mapExtent) []mapExtent {
	if k := len(ext); k > 0 && ext[k-1].Hole == e.Hole && ext[k-1].Off+ext[k-1].Len == e.Off {
		ext[k-1].Len += e.Len
		return ext
	}
	return append(ext, e)
}

// checkMap compares a map with the expected one, which must tile the array.
func checkMap(t *testing.T, tool string, got []mapExtent, want ...mapExtent) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s:\n got %v\nwant %v", tool, got, want)
	}
}

// TestMapHoles: `nbdinfo --map` (and `qemu-img map`) see a fresh array as one hole; after
// qemu-io writes a range, exactly that range (whole 4 KiB blocks) is data; after a discard of
// whole stripes around it, all hole again. Reads through the same clients, which negotiate
// structured replies, return the right bytes, and nbdcopy — structured replies and block
// status together, skipping the holes — copies the whole array byte for byte.
func TestMapHoles(t *testing.T) {
	need(t, "nbdinfo", "qemu-io")
	a := newArray(t)
	s := a.serve(t)
	hole := func(off, n int64) mapExtent { return mapExtent{off, n, true} }
	data := func(off, n int64) mapExtent { return mapExtent{off, n, false} }
	maps := func(want ...mapExtent) {
		t.Helper()
		checkMap(t, "nbdinfo --map", nbdinfoMap(t, s.uri), want...)
		if _, err := exec.LookPath("qemu-img"); err == nil {
			checkMap(t, "qemu-img map", qemuImgMap(t, s.uri), want...)
		}
	}
	maps(hole(0, arraySize))

	// Across a chunk and a stripe boundary, 4 KiB-aligned; qemu-io's default writethrough
	// cache makes these FUA writes, so they are on the members when it exits.
	off, n := int64(5*stripeData-2*chunkSize+12288), int64(3*chunkSize+8192)
	qemuIO(t, s.uri, []qemuOp{{kind: "write", off: off, n: n, pattern: 0xa7}})
	maps(hole(0, off), data(off, n), hole(off+n, arraySize-off-n))
	qemuIO(t, s.uri, []qemuOp{
		{kind: "read", off: off, n: n, pattern: 0xa7},
		{kind: "read", off: off - 65536, n: 65536, pattern: 0},
		{kind: "read", off: off + n, n: 65536, pattern: 0},
	})
	model := make([]byte, arraySize)
	for i := off; i < off+n; i++ {
		model[i] = 0xa7
	}
	copyCompare(t, s.uri, model)

	// Discard the whole stripes that hold the write: holes again, reading as zeroes.
	d0, d1 := off/stripeData*stripeData, (off+n+stripeData-1)/stripeData*stripeData
	qemuIO(t, s.uri, []qemuOp{{kind: "discard", off: d0, n: d1 - d0}, {kind: "read", off: d0, n: d1 - d0, pattern: 0}})
	maps(hole(0, arraySize))
}

// copyCompare copies the export to a file with nbdcopy, if installed, and compares every byte
// with model.
func copyCompare(t *testing.T, uri string, model []byte) {
	t.Helper()
	if _, err := exec.LookPath("nbdcopy"); err != nil {
		t.Log("nbdcopy not installed; copy not compared")
		return
	}
	dst := filepath.Join(t.TempDir(), "copy.img")
	if err := os.WriteFile(dst, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "nbdcopy", uri, dst)
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(model) {
		t.Fatalf("nbdcopy wrote %d bytes, want %d", len(got), len(model))
	}
	if !bytes.Equal(got, model) {
		for i := range got {
			if got[i] != model[i] {
				t.Fatalf("nbdcopy: byte %d is %#x, want %#x", i, got[i], model[i])
			}
		}
	}
}
