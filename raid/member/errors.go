package member

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Errors of member I/O. Each carries the NBD errno a server should reply with (Errno() uint32);
// the raid package re-exports them (raid.ErrShortRead, raid.ErrMemberShrunk) and returns them
// inside a *raid.MemberError.
var (
	// ErrShortRead is the error of a member read that returned fewer bytes than asked: a file
	// truncated (or a block device shrunk) under the array, or a Member that broke the ReadAt
	// contract. File's ReadAt and ReadvAt return it at the end of the file, saying how long
	// the file now is, and ReadFull, Readv and CheckRead turn any short count (with io.EOF or
	// none) into it. Errno EIO.
	ErrShortRead error = &errnoError{"raid: member returned less than asked (truncated?)", uint32(unix.EIO)}
	// ErrShrunk is returned by SizeChecker.CheckSize, and so by SyncData, for a member found
	// smaller than when it was opened, and by File's writes for a file truncated under the
	// array that the write grew (or would have grown back whole: refused). Errno EIO.
	ErrShrunk error = &errnoError{"raid: member is smaller than when it was opened (truncated?)", uint32(unix.EIO)}
)

// Errors of opening a member.
var (
	// ErrBusy is returned, inside a *BusyError naming the holder, by OpenFile (and so by
	// Open for a path) when the file or device is in use: another raid5d holds its lock (or
	// another open of it in this process does, or a read-write open meets read-only ones),
	// or the kernel holds a block device for exclusive use (mounted, part of md or dm, or
	// opened with O_EXCL by another program). raid.ErrMemberBusy is this error.
	ErrBusy = errors.New("raid: member in use")
	// ErrUnknownKind is returned, inside an *UnknownKindError naming the spec and the
	// registered kinds, by Open and MapSpecPath for a spec of the form scheme://... whose
	// prefix no registered kind has (a typo, or a kind the program did not register). It is
	// never fs.ErrNotExist, so the array does not take such a member for a missing one.
	// raid.ErrUnknownMemberKind is this error.
	ErrUnknownKind = errors.New("raid: no registered kind of member for this spec")
	// ErrNoDirect is returned, inside an *os.PathError naming the file, by OpenFile (and so by
	// Open for a path) under DirectOn for a file that cannot do direct I/O: its file system
	// refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE file systems), or its size is not a
	// multiple of its direct-I/O block. serve --direct=auto (the default) or off opens it
	// through the page cache instead.
	ErrNoDirect = errors.New("raid: member cannot do direct I/O (O_DIRECT)")
)

type errnoError struct {
	msg   string
	errno uint32
}

func (e *errnoError) Error() string { return e.msg }
func (e *errnoError) Errno() uint32 { return e.errno }
