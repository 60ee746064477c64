package test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// needBlockDevices skips (or fails under RAID5D_REQUIRE_TOOLS=1) unless this test can run
// nbdfuse, set up loop devices and mount filesystems: root, /dev/fuse, /dev/loop-control.
func needBlockDevices(t *testing.T) {
	t.Helper()
	need(t, "nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "fsck.ext4", "mount", "umount", "cp")
	if os.Geteuid() != 0 {
		skipOrFail(t, "loop devices and mount need root (euid %d)", os.Geteuid())
	}
	for _, dev := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(dev); err != nil {
			skipOrFail(t, "no %s: %v", dev, err)
		}
	}
}

// loopDisk is an NBD export made a kernel block device without the nbd module: nbdfuse exposes
// the export as the file <fuseDir>/nbd, and a loop device is attached to that file.
type loopDisk struct {
	t       *testing.T
	fuse    *proc
	fuseDir string
	dev     string   // /dev/loopN
	mounts  []string // mount points still mounted
	gone    bool     // detach has run
}

// attachLoop starts nbdfuse on uri, waits for its file to appear with the export's size, and
// attaches a loop device to it. A cleanup detaches everything (see detach).
func attachLoop(t *testing.T, uri string) *loopDisk {
	t.Helper()
	return attachLoopIn(t, nil, uri)
}

// attachLoopIn is attachLoop with nbdfuse run under prefix (see prefixed), which must leave
// it in this mount namespace (netHost.netPrefix: a client on a lab's host).
func attachLoopIn(t *testing.T, prefix []string, uri string) *loopDisk {
	t.Helper()
	dir, err := os.MkdirTemp("", "r5fuse")
	if err != nil {
		t.Fatal(err)
	}
	d := &loopDisk{t: t, fuseDir: dir}
	d.fuse = startProcIn(t, prefix, "nbdfuse", dir, uri)
	t.Cleanup(d.detach)
	file := filepath.Join(dir, "nbd")
	waitFor(t, "nbdfuse to expose "+file, startTimeout, d.fuse, func() bool {
		_, err := os.Stat(file)
		return err == nil
	})
	if fi, err := os.Stat(file); err != nil || fi.Size() != arraySize {
		t.Fatalf("nbdfuse file %s: %v, size %d, want %d", file, err, fi.Size(), int64(arraySize))
	}
	d.dev = strings.TrimSpace(runTool(t, "losetup", "--find", "--show", file))
	if !strings.HasPrefix(d.dev, "/dev/loop") {
		t.Fatalf("losetup --find --show printed %q, want a /dev/loopN", d.dev)
	}
	return d
}

// mount mounts the loop device's ext4 on a new directory and returns it.
func (d *loopDisk) mount(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "r5mnt")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runToolErr("mount", "-t", "ext4", d.dev, dir); err != nil {
		os.Remove(dir)
		t.Fatalf("mount %s %s: %v\n%s", d.dev, dir, err, out)
	}
	d.mounts = append(d.mounts, dir)
	return dir
}

// umount unmounts dir (mounted by mount) and removes the empty mount point.
func (d *loopDisk) umount(t testing.TB, dir string) {
	t.Helper()
	if out, err := runToolErr("umount", dir); err != nil {
		t.Fatalf("umount %s: %v\n%s", dir, err, out)
	}
	for i, m := range d.mounts {
		if m == dir {
			d.mounts = append(d.mounts[:i], d.mounts[i+1:]...)
			break
		}
	}
	if err := os.Remove(dir); err != nil {
		t.Errorf("removing mount point: %v", err)
	}
}

// detach undoes attachLoop in reverse: unmounts what is still mounted, detaches only the loop
// device it attached, unmounts the FUSE file system and waits for nbdfuse to exit (SIGTERM,
// then SIGKILL, by PID). It reports failures with Errorf and runs once.
func (d *loopDisk) detach() {
	t := d.t
	if d.gone {
		return
	}
	d.gone = true
	for _, m := range d.mounts {
		if out, err := runToolErr("umount", m); err != nil {
			t.Errorf("umount %s: %v\n%s", m, err, out)
			if out, err := runToolErr("umount", "-l", m); err != nil {
				t.Errorf("umount -l %s: %v\n%s", m, err, out)
				continue
			}
		}
		os.Remove(m)
	}
	d.mounts = nil
	if d.dev != "" {
		if out, err := runToolErr("losetup", "-d", d.dev); err != nil {
			t.Errorf("losetup -d %s: %v\n%s", d.dev, err, out)
		}
	}
	// The loop device lets go of the FUSE file asynchronously: retry while it is busy.
	deadline := time.Now().Add(20 * time.Second)
	for d.fuse.running() {
		out, err := runToolErr("fusermount3", "-u", d.fuseDir)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("fusermount3 -u %s: %v\n%s", d.fuseDir, err, out)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// nbdfuse exits by itself once unmounted; signal it only if it does not.
	select {
	case <-d.fuse.exited:
	case <-time.After(10 * time.Second):
	}
	if killed, err := d.fuse.stop(syscall.SIGTERM, 10*time.Second); killed || err != nil {
		t.Errorf("nbdfuse after unmount: killed %v, exit %v", killed, err)
	}
	if err := os.Remove(d.fuseDir); err != nil {
		t.Errorf("removing FUSE mount point: %v", err)
	}
}

// makeTree writes a tree of files with random content under dir (several directories, sizes
// from empty to over a MiB, some odd) and returns each file's relative path and SHA-256.
func makeTree(t *testing.T, dir string, seed uint64) map[string]string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	sums := map[string]string{}
	sizes := []int{0, 1, 511, 4096, 65537, 1<<20 + 13, 196608}
	for i := range 24 {
		size := rng.IntN(400 << 10)
		if i < len(sizes) {
			size = sizes[i]
		}
		rel := filepath.Join(fmt.Sprintf("dir%d", i%4), fmt.Sprintf("sub%d", i%3), fmt.Sprintf("file%02d.bin", i))
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		sums[rel] = hex.EncodeToString(sum[:])
	}
	return sums
}

// checkTree fails the test unless dir holds exactly the files in sums (lost+found aside), each
// with its SHA-256.
func checkTree(t *testing.T, dir string, sums map[string]string) {
	t.Helper()
	seen := 0
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if e.IsDir() {
			if rel == "lost+found" {
				return filepath.SkipDir
			}
			return nil
		}
		want, ok := sums[rel]
		if !ok {
			t.Errorf("unexpected file %s", rel)
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s: sha256 %s, want %s", rel, got, want)
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != len(sums) {
		t.Errorf("found %d of %d files", seen, len(sums))
	}
}

// TestFilesystem puts ext4 on the array through nbdfuse and a loop device, copies a tree in,
// checks the filesystem, restarts the daemon and checks every file again.
func TestFilesystem(t *testing.T) {
	needBlockDevices(t)
	src := t.TempDir()
	sums := makeTree(t, src, 20261130)
	for _, mode := range []struct {
		name  string
		flags []string
	}{
		{"default", nil},
		{"stable-pages", []string{"--stable-pages", "--debug-immutable"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if standin && mode.flags != nil {
				t.Skip("stand-in server has no such modes")
			}
			a := newArray(t)
			s := a.serve(t, mode.flags...)
			d := attachLoop(t, s.uri)
			runTool(t, "mkfs.ext4", "-q", d.dev)
			mnt := d.mount(t)
			runTool(t, "cp", "-a", src+"/.", mnt)
			checkTree(t, mnt, sums)
			d.umount(t, mnt)
			runTool(t, "fsck.ext4", "-fn", d.dev)
			d.detach()

			// Everything from here on reads what the daemon stored, not a kernel cache.
			s.stop()
			s = a.serve(t, mode.flags...)
			d = attachLoop(t, s.uri)
			runTool(t, "fsck.ext4", "-fn", d.dev)
			mnt = d.mount(t)
			checkTree(t, mnt, sums)
			d.umount(t, mnt)
		})
	}
}
