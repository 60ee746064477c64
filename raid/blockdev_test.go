package raid_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// TestBlockDevices runs an array on loop devices: BLKGETSIZE64 sizing, Create's zeroing of a
// dirty device, writes, trims (zero-out on a block device), close, assemble and a byte compare.
// It needs root and losetup, and runs only with RAID5D_PRIVILEGED=1.
func TestBlockDevices(t *testing.T) {
	if os.Getenv("RAID5D_PRIVILEGED") != "1" {
		t.Skip("set RAID5D_PRIVILEGED=1 (as root, with losetup) to run on loop devices")
	}
	const stripes = 32
	dir := t.TempDir()
	devs := make([]string, 3)
	for i := range devs {
		img := filepath.Join(dir, "loop"+string(rune('0'+i))+".img")
		// Garbage in the data area proves that Create zeroes block devices.
		junk := bytes.Repeat([]byte{0xa5}, raid.DataOffset+stripes*testChunk+i*testChunk)
		if err := os.WriteFile(img, junk, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("losetup", "-f", "--show", img).Output()
		if err != nil {
			t.Fatalf("losetup: %v", err)
		}
		devs[i] = strings.TrimSpace(string(out))
		t.Cleanup(func() { exec.Command("losetup", "-d", devs[i]).Run() })
	}
	a, err := raid.Create(devs, raid.CreateOptions{Chunk: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	size := mustSize(a)
	if want := int64(stripes) * a.Layout().StripeSize(); size != want {
		t.Fatalf("Size = %d, want %d (the smallest loop device)", size, want)
	}
	model := make([]byte, size)
	compareArray(t, a, model)
	fill(newRand(5), model[:size/2])
	if _, err := a.WriteAt(model[:size/2], 0); err != nil {
		t.Fatal(err)
	}
	ss := a.Layout().StripeSize()
	if err := a.Trim(ss+100, 5*ss); err != nil {
		t.Fatal(err)
	}
	clear(model[ss+100 : 6*ss+100])
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := raid.Assemble([]string{devs[2], devs[0], devs[1]}, raid.AssembleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	compareArray(t, b, model)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, devs, b.Layout(), model, -1)
}
