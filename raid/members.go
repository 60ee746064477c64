package raid

import (
	"golang.org/x/sys/unix"

	memberpkg "github.com/raid5d/raid5d/raid/member" // raid's own type is member (failure.go)
)

// Member is one disk of the array: see memberpkg.Member for its contract.
type Member = memberpkg.Member

// BusyError is the error for a member in use (errors.Is(err, ErrMemberBusy)): see
// memberpkg.BusyError.
type BusyError = memberpkg.BusyError

// Holder is a process that holds a member's lock (BusyError.Holders).
type Holder = memberpkg.Holder

// OpenMember opens a regular file or a block device as a member, for exclusive use: it holds a
// lock on it until Close, exclusive when read-write (and a block device is opened with O_EXCL),
// shared when readOnly (doc.go # Exclusive use). A member in use elsewhere is ErrMemberBusy,
// in a *BusyError naming the holder. A block device's size comes from BLKGETSIZE64, a file's
// from its length. A path of the form faulty:PATH?... (or volatile:PATH?..., short for
// faulty:PATH?volatile&...) opens PATH wrapped in fault injection, a testing aid (doc.go #
// Testing with faulty members).
func OpenMember(path string, readOnly bool) (Member, error) {
	if readOnly {
		return openMember(path, useShared)
	}
	return openMember(path, useExclusive)
}

// openMember is OpenMember with the use (and lock) spelled out; Examine inspects members
// without a lock.
func openMember(path string, use memberUse) (Member, error) {
	if m, ok, err := openSpec(path, use); ok {
		return m, err
	}
	m, err := memberpkg.OpenFile(path, use)
	if err != nil {
		return nil, err // not a nil *memberpkg.File in a Member
	}
	return m, nil
}

// The member package's names as the array's files use them.

type (
	fileMember = memberpkg.File
	memberUse  = memberpkg.Use
	mapper     = memberpkg.Mapper     // mapped reads (mapped.go)
	holeFinder = memberpkg.HoleFinder // block status (blockstatus.go)
)

const (
	useExclusive = memberpkg.Exclusive
	useShared    = memberpkg.Shared
	useInspect   = memberpkg.Inspect
)

const maxIov = memberpkg.MaxIov

func readFull(m Member, p []byte, off int64) (int, error) { return memberpkg.ReadFull(m, p, off) }

func readv(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	return memberpkg.Readv(m, bufs, off, iov)
}

func writev(m Member, bufs [][]byte, off int64, iov []unix.Iovec) (int, error) {
	return memberpkg.Writev(m, bufs, off, iov)
}

func syncData(m Member) error { return memberpkg.SyncData(m) }

func createMemberFile(path string, size int64) error { return memberpkg.CreateFile(path, size) }

func resident(b, vec []byte) (bool, []byte) { return memberpkg.Resident(b, vec) }

// zeroBuf is a shared, never-written buffer of zeroes.
var zeroBuf = make([]byte, 1<<20)
