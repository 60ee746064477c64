package vm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// cpioWriter writes a cpio archive in the "newc" format, the one the kernel unpacks as an
// initramfs. Several archives concatenated are unpacked in order, later files replacing earlier
// ones, which is how a run's own files (its script, its module list) go on top of the shared base.
// Directories are written before anything inside them, once each.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	dirs map[string]bool // directories written so far
	err  error           // the first write error; later writes do nothing
}

func newCPIO(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1, dirs: map[string]bool{"": true, ".": true, "/": true}}
}

// header writes one entry's header and name (padded to 4 bytes).
func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	if c.err != nil {
		return
	}
	if size > 0xffffffff {
		c.err = fmt.Errorf("cpio: %s: %d bytes do not fit newc's size field", name, size)
		return
	}
	name = strings.TrimPrefix(name, "/")
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name))
	c.write([]byte{0})
	c.pad(int64(len(hdr) + len(name) + 1))
}

func (c *cpioWriter) write(p []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(p)
	}
}

// pad writes the zeroes that bring an entry part of n bytes to a multiple of 4.
func (c *cpioWriter) pad(n int64) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// mkdirAll writes dir and its parents that are not written yet.
func (c *cpioWriter) mkdirAll(dir string) {
	dir = path.Clean("/" + dir)
	if c.dirs[dir] {
		return
	}
	c.mkdirAll(path.Dir(dir))
	c.dirs[dir] = true
	c.header(dir, 0o040755, 0, 0, 0)
}

// file writes a regular file with the given permission bits, its parents first.
func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.mkdirAll(path.Dir(name))
	c.header(name, 0o100000|perm, int64(len(data)), 0, 0)
	c.write(data)
	c.pad(int64(len(data)))
}

// copyFile writes the host file src (following symbolic links) as name, keeping its permissions.
func (c *cpioWriter) copyFile(name, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.err = err
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		c.err = err
		return
	}
	c.mkdirAll(path.Dir(name))
	c.header(name, 0o100000|uint32(fi.Mode().Perm()), fi.Size(), 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, f)
	if err == nil && n != fi.Size() {
		err = fmt.Errorf("cpio: %s changed size while copied (%d of %d bytes)", src, n, fi.Size())
	}
	if err != nil {
		c.err = err
		return
	}
	c.pad(n)
}

// symlink writes a symbolic link name -> target.
func (c *cpioWriter) symlink(name, target string) {
	c.mkdirAll(path.Dir(name))
	c.header(name, 0o120777, int64(len(target)), 0, 0)
	c.write([]byte(target))
	c.pad(int64(len(target)))
	c.dirs[path.Clean("/"+name)] = true // a link to a directory stands for it
}

// charDev writes a character device node.
func (c *cpioWriter) charDev(name string, perm, major, minor uint32) {
	c.mkdirAll(path.Dir(name))
	c.header(name, 0o020000|perm, 0, major, minor)
}

// close writes the trailer and flushes.
func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}

// sortedKeys returns m's keys in order, so archives come out the same every time.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
