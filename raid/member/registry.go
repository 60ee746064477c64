package member

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Kind is a kind of member other than a plain path: the members whose specs start with its
// prefix (Register). Only Open is required.
type Kind struct {
	// Open opens the member spec names (spec starts with the kind's prefix) for use: read-write
	// for Exclusive, read-only otherwise, holding whatever claim the kind has on it (a file's
	// lock) until Close. Its Name is what the array records and matches (the spec, or the
	// path a wrapper wraps). A member that does not exist is fs.ErrNotExist, which Assemble
	// takes for a missing member; any other failure is an error naming the spec.
	Open func(spec string, use Use) (Member, error)
	// OpenContext is Open with its waits (a dial, a handshake) ending when ctx ends as well
	// as by the kind's own bounds: Assemble retries a remote member that does not answer
	// yet within a bound, and stops when waiting is no longer of use; an attempt must not
	// outlast either. nil: Open, whose own bounds apply.
	OpenContext func(ctx context.Context, spec string, use Use) (Member, error)
	// Path returns the local file or device spec opens, for the checks that compare files
	// (is the journal one of the members?) and for Create to make; "" if none, as for a
	// remote export. nil: "".
	Path func(spec string) string
	// MapPath returns spec with the local path it opens replaced by f(path), all else
	// unchanged: the command line makes paths absolute, a configuration file resolves them
	// from its directory. nil: spec unchanged.
	MapPath func(spec string, f func(string) (string, error)) (string, error)
}

var kinds struct {
	mu sync.RWMutex // guards m
	m  map[string]Kind
}

// Register adds the kind of member whose specs start with prefix ("faulty:", "nbd://"), so that
// Open, SpecPath and MapSpecPath dispatch to it. The program registers its kinds before it
// opens members (cmd/raid5d does, from main; a test from TestMain), with whatever options
// they take bound into k's functions: the raid package knows no kind but plain paths. Where
// several prefixes match a spec, the longest wins. It panics for an empty prefix, a nil Open,
// or a prefix registered twice: those are programming errors.
func Register(prefix string, k Kind) {
	if prefix == "" || k.Open == nil {
		panic("member: Register needs a prefix and an Open function")
	}
	kinds.mu.Lock()
	defer kinds.mu.Unlock()
	if _, dup := kinds.m[prefix]; dup {
		panic(fmt.Sprintf("member: kind %q registered twice", prefix))
	}
	if kinds.m == nil {
		kinds.m = map[string]Kind{}
	}
	kinds.m[prefix] = k
}

// kindOf returns the registered kind whose prefix spec starts with (the longest), ok false for
// a plain path.
func kindOf(spec string) (k Kind, ok bool) {
	kinds.mu.RLock()
	defer kinds.mu.RUnlock()
	best := -1
	for p, kk := range kinds.m {
		if len(p) > best && strings.HasPrefix(spec, p) {
			k, ok, best = kk, true, len(p)
		}
	}
	return k, ok
}

// uriScheme returns the scheme of a spec of the form scheme://... (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.'), "" for any other spec.
func uriScheme(spec string) string {
	i := strings.Index(spec, "://")
	if i <= 0 {
		return ""
	}
	for j, c := range spec[:i] {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case j > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return ""
		}
	}
	return spec[:i]
}

// UnknownKindError is Open's and MapSpecPath's error for a spec of the form scheme://... of
// no registered kind: errors.Is(err, ErrUnknownKind). Such a spec is never taken for a path,
// so it never reaches OpenFile, whose fs.ErrNotExist the array would count as a missing
// member.
type UnknownKindError struct {
	Spec  string
	Kinds []string // the registered prefixes, sorted
}

func (e *UnknownKindError) Error() string {
	return fmt.Sprintf("%v: %q (registered kinds: %s)", ErrUnknownKind, e.Spec, strings.Join(e.Kinds, " "))
}

func (e *UnknownKindError) Unwrap() error { return ErrUnknownKind }

// unknownKind returns the *UnknownKindError of spec, which no kind has.
func unknownKind(spec string) error {
	kinds.mu.RLock()
	known := make([]string, 0, len(kinds.m))
	for p := range kinds.m {
		known = append(known, p)
	}
	kinds.mu.RUnlock()
	slices.Sort(known)
	return &UnknownKindError{Spec: spec, Kinds: known}
}

// Open opens the member spec names for use: a registered kind's (Register) if spec starts
// with its prefix, else the file or block device at the path spec (OpenFile). A spec of the
// form scheme://... of no registered kind is an *UnknownKindError.
func Open(spec string, use Use) (Member, error) {
	if k, ok := kindOf(spec); ok {
		return k.Open(spec, use)
	}
	if uriScheme(spec) != "" {
		return nil, unknownKind(spec)
	}
	m, err := OpenFile(spec, use)
	if err != nil {
		return nil, err // not a nil *File in a Member
	}
	return m, nil
}

// OpenContext is Open with its waits ending when ctx ends too, where the kind can bound them
// (Kind.OpenContext); a plain path opens at once.
func OpenContext(ctx context.Context, spec string, use Use) (Member, error) {
	if k, ok := kindOf(spec); ok && k.OpenContext != nil {
		return k.OpenContext(ctx, spec, use)
	}
	return Open(spec, use)
}

// SpecPath returns the local file or device a member spec opens: the spec itself for a plain
// path, what its kind's Path says for another ("" for a remote member, and for a spec of the
// form scheme://... of no registered kind: no file is made for it, Open refuses it).
func SpecPath(spec string) string {
	k, ok := kindOf(spec)
	switch {
	case !ok && uriScheme(spec) != "":
		return ""
	case !ok:
		return spec
	case k.Path == nil:
		return ""
	}
	return k.Path(spec)
}

// MapSpecPath returns spec with the local path it opens replaced by f(path) (Kind.MapPath;
// for a plain path, f(spec)). A spec of the form scheme://... of no registered kind is
// returned unchanged, with an *UnknownKindError.
func MapSpecPath(spec string, f func(string) (string, error)) (string, error) {
	k, ok := kindOf(spec)
	switch {
	case !ok && uriScheme(spec) != "":
		return spec, unknownKind(spec)
	case !ok:
		return f(spec)
	case k.MapPath == nil:
		return spec, nil
	}
	return k.MapPath(spec, f)
}
