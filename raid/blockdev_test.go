package raid_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/internal/looptest"
	"github.com/raid5d/raid5d/raid"
)

// loopDevices attaches n loop devices to files of size bytes (each filled with junk) and
// detaches them when the test ends.
func loopDevices(t *testing.T, n int, size int) []string {
	t.Helper()
	dir := t.TempDir()
	devs := make([]string, n)
	for i := range devs {
		img := filepath.Join(dir, "loop"+string(rune('0'+i))+".img")
		if err := os.WriteFile(img, bytes.Repeat([]byte{0xa5}, size), 0o600); err != nil {
			t.Fatal(err)
		}
		devs[i] = attachLoop(t, img)
	}
	return devs
}

// TestExclusiveBlockDevices: a member block device in use is refused (ErrMemberBusy): while an
// array holds it (the kernel's O_EXCL claim, and raid5d's lock naming this process), while
// another program has it open with O_EXCL, and while it is mounted (the mount point named).
// Examine reads it meanwhile. Needs root and losetup (RAID5D_PRIVILEGED=1); mkfs.ext4 and
// mount for the last case.
func TestExclusiveBlockDevices(t *testing.T) {
	if os.Getenv("RAID5D_PRIVILEGED") != "1" {
		t.Skip("set RAID5D_PRIVILEGED=1 (as root, with losetup) to run on loop devices")
	}
	devs := loopDevices(t, 3, raid.DataOffset+32*testChunk)
	a, err := raid.Create(devs, raid.CreateOptions{Chunk: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, ro := range []bool{false, true} {
		_, err := raid.OpenMember(devs[0], ro)
		wantBusy(t, fmt.Sprintf("OpenMember(%s, read-only %v) of a member in use", devs[0], ro), err)
		var be *raid.BusyError
		if errors.As(err, &be); be.Claimed == ro { // read-write: O_EXCL fails first
			t.Errorf("read-only %v: Claimed %v: %v", ro, be.Claimed, err)
		}
	}
	if rep, err := raid.Examine(devs); err != nil || len(rep.Missing) != 0 {
		t.Fatalf("Examine of block devices in use: %v (%+v)", err, rep)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	fd, err := unix.Open(devs[1], unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = raid.OpenMember(devs[1], false)
	unix.Close(fd)
	var be *raid.BusyError
	if !errors.As(err, &be) || !errors.Is(err, raid.ErrMemberBusy) || !be.Claimed || len(be.Holders) != 0 {
		t.Fatalf("OpenMember of a device another program opened with O_EXCL: %v, want a claimed ErrMemberBusy", err)
	}
	t.Log(err)

	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4: the mounted case is not run")
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", devs[2]).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", devs[2], mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	_, err = raid.OpenMember(devs[2], false)
	if !errors.As(err, &be) || !be.Claimed || be.Claim != "mounted on "+mnt {
		t.Fatalf("OpenMember of a mounted device: %v, want ErrMemberBusy saying it is mounted on %s", err, mnt)
	}
	t.Log(err)
}

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
		devs[i] = attachLoop(t, img)
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

// attachLoop attaches img to a free loop device, detached when the test ends, and returns it.
func attachLoop(t *testing.T, img string) string {
	t.Helper()
	dev, err := looptest.Attach(t, img, looptest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return dev
}
