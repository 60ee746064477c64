package member

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// NextData (HoleFinder): lseek SEEK_DATA; a block device cannot tell.
func (m *File) NextData(off, end int64) (int64, bool, error) {
	if m.block {
		return 0, false, nil
	}
	d, err := seek(m.fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO): // no data at or after off
		return end, true, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return 0, false, nil // a file system without SEEK_DATA
	case err != nil:
		return 0, false, &fileErr{op: "lseek SEEK_DATA", path: m.path, err: err}
	}
	return min(d, end), true, nil
}

// NextHole (HoleFinder): lseek SEEK_HOLE.
func (m *File) NextHole(off, end int64) (int64, error) {
	h, err := seek(m.fd, off, unix.SEEK_HOLE)
	if errors.Is(err, unix.ENXIO) { // off at or past the end of the file: a hole from there
		return off, nil
	}
	if err != nil {
		return 0, &fileErr{op: "lseek SEEK_HOLE", path: m.path, err: err}
	}
	return min(h, end), nil
}

// fileErr names the member and the call in an lseek error.
type fileErr struct {
	op, path string
	err      error
}

func (e *fileErr) Error() string { return fmt.Sprintf("%s %s: %v", e.op, e.path, e.err) }
func (e *fileErr) Unwrap() error { return e.err }

// seek is lseek, retrying EINTR. The file offset it moves is never used: members are read and
// written with pread and pwrite.
func seek(fd int, off int64, whence int) (int64, error) {
	for {
		n, err := unix.Seek(fd, off, whence)
		if err != unix.EINTR {
			return n, err
		}
	}
}
