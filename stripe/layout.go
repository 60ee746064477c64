package stripe

import (
	"errors"
	"math/bits"
	"strconv"
)

// Algorithm is an md RAID-5 parity layout. The values are md's own (ALGORITHM_* in
// drivers/md/raid5.h), so they can be stored on disk and compared with mdadm's output.
type Algorithm uint8

const (
	LeftAsymmetric  Algorithm = 0
	RightAsymmetric Algorithm = 1
	LeftSymmetric   Algorithm = 2 // md's default, and raid5d's
	RightSymmetric  Algorithm = 3
)

// DefaultAlgorithm is the layout used when none is given: left-symmetric, as in md.
const DefaultAlgorithm = LeftSymmetric

var algorithmNames = [...]string{
	LeftAsymmetric:  "left-asymmetric",
	RightAsymmetric: "right-asymmetric",
	LeftSymmetric:   "left-symmetric",
	RightSymmetric:  "right-symmetric",
}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Valid reports whether a is one of the four RAID-5 layouts.
func (a Algorithm) Valid() bool { return int(a) < len(algorithmNames) }

// ParseAlgorithm parses md's layout names ("left-symmetric", ...) and the short forms
// mdadm also accepts ("ls", "la", "rs", "ra").
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if s == n {
			return Algorithm(i), nil
		}
	}
	switch s {
	case "la":
		return LeftAsymmetric, nil
	case "ra":
		return RightAsymmetric, nil
	case "ls":
		return LeftSymmetric, nil
	case "rs":
		return RightSymmetric, nil
	}
	return 0, &detailError{ErrAlgorithm, strconv.Quote(s) + " (want left-symmetric, left-asymmetric, right-symmetric or right-asymmetric)"}
}

// Geometry bounds.
const (
	MinChunk     = 4 << 10
	MaxChunk     = 4 << 20
	DefaultChunk = 64 << 10
	MinMembers   = 3
	MaxMembers   = 32
)

var (
	// ErrAlgorithm is returned by NewLayout and ParseAlgorithm for an unknown layout.
	ErrAlgorithm = errors.New("stripe: unknown layout")
	// ErrChunk is returned by NewLayout for a chunk size that is not a power of two in MinChunk..MaxChunk.
	ErrChunk = errors.New("stripe: chunk size must be a power of two from 4 KiB to 4 MiB")
	// ErrMembers is returned by NewLayout for a member count outside MinMembers..MaxMembers.
	ErrMembers = errors.New("stripe: member count must be 3 to 32")
)

// detailError is a sentinel with the value that caused it ("sentinel: detail"), as
// fmt.Errorf("%w: ...") would build it: the package avoids fmt, whose imports reach os.
type detailError struct {
	err    error
	detail string
}

func (e *detailError) Error() string { return e.err.Error() + ": " + e.detail }
func (e *detailError) Unwrap() error { return e.err }

// Layout is the geometry of a RAID-5 array: how array offsets map to members. It is a small
// value, immutable and safe to share. Member offsets are relative to the start of each member's
// data area; the caller adds the data offset.
type Layout struct {
	members    int
	chunk      int64
	chunkShift uint
	alg        Algorithm
}

// NewLayout checks and returns a layout of members members, chunk bytes per chunk and algorithm alg.
func NewLayout(members int, chunk int64, alg Algorithm) (Layout, error) {
	if members < MinMembers || members > MaxMembers {
		return Layout{}, &detailError{ErrMembers, strconv.Itoa(members)}
	}
	if chunk < MinChunk || chunk > MaxChunk || chunk&(chunk-1) != 0 {
		return Layout{}, &detailError{ErrChunk, strconv.FormatInt(chunk, 10)}
	}
	if !alg.Valid() {
		return Layout{}, &detailError{ErrAlgorithm, strconv.Itoa(int(alg))}
	}
	return Layout{members: members, chunk: chunk, chunkShift: uint(bits.TrailingZeros64(uint64(chunk))), alg: alg}, nil
}

func (l Layout) Members() int         { return l.members }
func (l Layout) DataMembers() int     { return l.members - 1 }
func (l Layout) ChunkSize() int64     { return l.chunk }
func (l Layout) Algorithm() Algorithm { return l.alg }

// StripeSize is the number of array (data) bytes in one stripe: chunk × (members-1).
func (l Layout) StripeSize() int64 { return l.chunk * int64(l.members-1) }

// ParityMember returns the member that holds stripe's parity chunk.
func (l Layout) ParityMember(stripe int64) int {
	r := int(stripe % int64(l.members))
	switch l.alg {
	case LeftAsymmetric, LeftSymmetric:
		return l.members - 1 - r
	default: // RightAsymmetric, RightSymmetric
		return r
	}
}

// DataMember returns the member that holds data chunk d (0 ≤ d < DataMembers()) of stripe.
func (l Layout) DataMember(stripe int64, d int) int {
	p := l.ParityMember(stripe)
	switch l.alg {
	case LeftSymmetric, RightSymmetric:
		return (p + 1 + d) % l.members
	default: // the asymmetric layouts skip over the parity member
		if d < p {
			return d
		}
		return d + 1
	}
}

// DataIndex returns which data chunk of stripe member holds, or -1 if it holds the parity.
// It is the inverse of DataMember.
func (l Layout) DataIndex(stripe int64, member int) int {
	p := l.ParityMember(stripe)
	if member == p {
		return -1
	}
	switch l.alg {
	case LeftSymmetric, RightSymmetric:
		return (member - p - 1 + l.members) % l.members
	default:
		if member < p {
			return member
		}
		return member - 1
	}
}

// Location is where one array byte lives.
type Location struct {
	Stripe    int64 // stripe number
	Data      int   // index of the data chunk within the stripe, 0..DataMembers()-1
	Member    int   // member holding that chunk
	Parity    int   // member holding the stripe's parity
	MemberOff int64 // offset in the member's data area
}

// Map returns the location of array offset off (off ≥ 0).
func (l Layout) Map(off int64) Location {
	c := off >> l.chunkShift
	within := off & (l.chunk - 1)
	dm := int64(l.members - 1)
	s, d := c/dm, int(c%dm)
	return Location{
		Stripe:    s,
		Data:      d,
		Member:    l.DataMember(s, d),
		Parity:    l.ParityMember(s),
		MemberOff: s<<l.chunkShift + within,
	}
}

// Extent is a piece of an array request that lies within one chunk.
type Extent struct {
	Stripe    int64 // stripe number
	Data      int   // data chunk index within the stripe
	Member    int   // member holding it
	MemberOff int64 // offset in the member's data area
	BufOff    int64 // offset of this piece in the request
	Len       int64 // length, never more than the rest of the chunk
}

// Extents appends to dst the pieces of the request [off, off+n), in array order, one per
// chunk touched, and returns the extended slice. They tile the request exactly and never name a
// parity chunk. It allocates only if dst lacks capacity.
func (l Layout) Extents(dst []Extent, off, n int64) []Extent {
	var done int64
	for done < n {
		loc := l.Map(off + done)
		within := (off + done) & (l.chunk - 1)
		ln := min(l.chunk-within, n-done)
		dst = append(dst, Extent{
			Stripe:    loc.Stripe,
			Data:      loc.Data,
			Member:    loc.Member,
			MemberOff: loc.MemberOff,
			BufOff:    done,
			Len:       ln,
		})
		done += ln
	}
	return dst
}
