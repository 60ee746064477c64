package member

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctlPtr issues an ioctl whose argument is a pointer to a [2]uint64 range (BLKZEROOUT).
func ioctlPtr(fd int, req uint, arg *[2]uint64) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(arg)))
	if e != 0 {
		return e
	}
	return nil
}
