// Package looptest attaches loop devices (losetup) for the tests that need a block device: a
// member opened O_DIRECT, a device's exclusive claim, a 4 KiB-sector disk. Each device is
// detached, by name, when the test ends. It is for tests only; attaching needs root and the
// loop driver, and where that is missing the error says so and the caller decides whether the
// test skips or fails (a test gated as privileged, or RAID5D_REQUIRE_TOOLS=1, fails).
package looptest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Options are losetup's settings for a device.
type Options struct {
	DirectIO   bool // --direct-io=on: the device reads and writes its file with O_DIRECT
	SectorSize int  // --sector-size: the logical block size; 0 is losetup's default (512)
}

// Attach attaches img to a free loop device and returns the device's path; a cleanup of t
// detaches it. The error names the losetup command and what it printed.
func Attach(t testing.TB, img string, o Options) (string, error) {
	t.Helper()
	args := []string{"-f", "--show"}
	if o.DirectIO {
		args = append(args, "--direct-io=on")
	}
	if o.SectorSize > 0 {
		args = append(args, "--sector-size", fmt.Sprint(o.SectorSize))
	}
	args = append(args, img)
	out, err := exec.Command("losetup", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("cannot attach a loop device here (needs root, losetup and the loop driver): losetup %s: %v: %s",
			strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev, nil
}

// AttachSparse makes n sparse files of size bytes in a temporary directory of t and attaches
// a loop device to each (Attach), returning the devices in order.
func AttachSparse(t testing.TB, n int, size int64, o Options) ([]string, error) {
	t.Helper()
	dir := t.TempDir()
	devs := make([]string, n)
	for i := range devs {
		img := filepath.Join(dir, fmt.Sprintf("loop%d.img", i))
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			return nil, err
		}
		if err := os.Truncate(img, size); err != nil {
			return nil, err
		}
		dev, err := Attach(t, img, o)
		if err != nil {
			return nil, err
		}
		devs[i] = dev
	}
	return devs, nil
}
