// Package member is the disks of an array as the raid package sees them: the Member interface
// and its contract, the optional capabilities a member may have, and the file and
// block-device member (File).
//
// # Contract
//
// A Member is io.ReaderAt and io.WriterAt with three differences that the array relies on
// (the Member doc says them in full): ReadAt returns len(p) bytes or an error, never a short
// count that the caller would fill with zeroes (ReadFull and Readv turn one into
// ErrShortRead); Trim leaves zeroes; Size is fixed while the member is open. Every method may
// be called concurrently and none keeps the caller's buffer.
//
// # Capabilities
//
// A member may do more than Member says, in small interfaces the array finds by type
// assertion, each with a helper or a path that does without it: Vectored (Readv, Writev:
// one call per buffer without it), DSyncWriter (one durable write; else WriteAt and Sync),
// SizeChecker (SyncData: no check without it), Mapper (mapped reads; else ReadAt),
// HoleFinder (block status; else all data) and Wrapper (Base). File has all but Wrapper.
//
// # Exclusive use
//
// OpenFile takes a flock(2) lock on the file or device node for as long as the member is
// open: exclusive for Exclusive, shared for Shared, none for Inspect; a block device opened
// Exclusive is opened with O_EXCL too. A member in use is ErrBusy in a *BusyError that names
// the holder. exclusive.go says why flock and not fcntl locks; raid's doc.go # Exclusive use
// says what the array does with it.
//
// # Errors
//
// ErrShortRead and ErrShrunk (I/O, errno EIO) and ErrBusy (opening). The raid package
// re-exports them as raid.ErrShortRead, raid.ErrMemberShrunk and raid.ErrMemberBusy, and
// its MemberError wraps them with the member's name and role.
package member
