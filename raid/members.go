package raid

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/internal/aligned"
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
// from its length. It is opened with O_DIRECT as memberpkg.SetDirect says (block devices by
// default; memberpkg # Direct I/O). A path of the form faulty:PATH?... (or volatile:PATH?..., short for
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
func openMember(path string, use memberUse) (Member, error) { return memberpkg.Open(path, use) }

// openMemberContext is openMember with its waits ending when ctx ends too
// (member.OpenContext).
func openMemberContext(ctx context.Context, path string, use memberUse) (Member, error) {
	return memberpkg.OpenContext(ctx, path, use)
}

// SpecPath returns the file or device a member spec opens: the PATH of faulty:PATH?... or
// volatile:PATH?..., a plain path itself, "" for a kind with no local file (memberpkg.SpecPath).
// Checks that compare files (is this journal a member?) stat it.
func SpecPath(spec string) string { return memberpkg.SpecPath(spec) }

// MapSpecPath returns spec with the path it opens replaced by f(path), its prefix and keys
// unchanged: the command line makes member and journal paths absolute with it
// (MapSpecPath(s, filepath.Abs)) without turning a spec into a path of a file named
// "faulty:..." (memberpkg.MapSpecPath).
func MapSpecPath(spec string, f func(string) (string, error)) (string, error) {
	return memberpkg.MapSpecPath(spec, f)
}

// The member package's names as the array's files use them.

type (
	fileMember = memberpkg.File
	memberUse  = memberpkg.Use
	mapper     = memberpkg.Mapper       // mapped reads (mapped.go)
	mapWriter  = memberpkg.MappedWriter // mapped writes (mapped.go)
	holeFinder = memberpkg.HoleFinder   // block status (blockstatus.go)
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

// zeroBuf is a shared, never-written buffer of zeroes, aligned for direct I/O (whole stripes
// of zeroes are written from it).
var zeroBuf = aligned.Make(1 << 20)
