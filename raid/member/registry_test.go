package member_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/raid5d/raid5d/raid/member"
)

// fakeRemote is a member of a registered kind: in memory, named by its spec.
type fakeRemote struct {
	member.Member // nil: only Name and Size are called
	spec          string
	use           member.Use
}

func (f *fakeRemote) Name() string { return f.spec }
func (f *fakeRemote) Size() int64  { return 1 << 20 }

// TestRegistry: Open sends a spec to the kind whose prefix it starts with (the longest of
// several), with the use it was given, and a plain path to OpenFile; SpecPath and MapSpecPath
// ask the kind, with "" and the spec unchanged for a kind without Path and MapPath (a remote
// member has no local file); Register refuses an empty prefix, a nil Open and a second
// registration of a prefix.
// testKinds registers the kinds of TestRegistry once per process (-count reruns it).
var (
	registerOnce sync.Once
	openedMu     sync.Mutex
	opened       = map[string]string{} // spec -> the kind that opened it
)

func registerTestKinds() {
	kind := func(name string) member.Kind {
		return member.Kind{Open: func(spec string, use member.Use) (member.Member, error) {
			openedMu.Lock()
			opened[spec] = name
			openedMu.Unlock()
			if strings.HasSuffix(spec, "/absent") {
				return nil, fs.ErrNotExist
			}
			return &fakeRemote{spec: spec, use: use}, nil
		}}
	}
	member.Register("regtest://", kind("short"))
	member.Register("regtest://long/", kind("long"))
	member.Register("regtestfile:", member.Kind{
		Open: kind("file").Open,
		Path: func(spec string) string { return strings.TrimPrefix(spec, "regtestfile:") },
		MapPath: func(spec string, f func(string) (string, error)) (string, error) {
			p, err := f(strings.TrimPrefix(spec, "regtestfile:"))
			return "regtestfile:" + p, err
		},
	})
}

func TestRegistry(t *testing.T) {
	registerOnce.Do(registerTestKinds)
	kind := func(string) member.Kind {
		return member.Kind{Open: func(string, member.Use) (member.Member, error) { return nil, nil }}
	}
	for spec, want := range map[string]string{
		"regtest://host/export":  "short",
		"regtest://long/export":  "long",
		"regtestfile:/some/file": "file",
	} {
		m, err := member.Open(spec, member.Shared)
		openedMu.Lock()
		by := opened[spec]
		openedMu.Unlock()
		if err != nil || by != want || m.Name() != spec || m.(*fakeRemote).use != member.Shared {
			t.Errorf("Open(%q) = %v, %v by kind %q; want the member named by its spec from kind %q", spec, m, err, by, want)
		}
	}
	if _, err := member.Open("regtest://host/absent", member.Exclusive); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a kind's missing member: %v, want fs.ErrNotExist", err)
	}

	path := filepath.Join(t.TempDir(), "m.img")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := member.Open(path, member.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.(*member.File); !ok || m.Name() != path {
		t.Errorf("Open of a plain path = %T named %q, want a *File named %q", m, m.Name(), path)
	}
	m.Close()
	var nilFile *member.File
	if m, err := member.Open(path+".absent", member.Exclusive); m != nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of an absent path = %v (nil *File: %v), %v; want a nil Member and fs.ErrNotExist", m, m == member.Member(nilFile), err)
	}

	upper := func(p string) (string, error) { return strings.ToUpper(p), nil }
	for _, c := range []struct{ spec, path, mapped string }{
		{"/a/b", "/a/b", "/A/B"},
		{"regtest://host/export", "", "regtest://host/export"},
		{"regtestfile:/x/y", "/x/y", "regtestfile:/X/Y"},
	} {
		if got := member.SpecPath(c.spec); got != c.path {
			t.Errorf("SpecPath(%q) = %q, want %q", c.spec, got, c.path)
		}
		if got, err := member.MapSpecPath(c.spec, upper); err != nil || got != c.mapped {
			t.Errorf("MapSpecPath(%q) = %q, %v; want %q", c.spec, got, err, c.mapped)
		}
	}

	for _, bad := range []struct {
		prefix string
		k      member.Kind
	}{{"", kind("x")}, {"regtestnil:", member.Kind{}}, {"regtest://", kind("again")}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", bad.prefix)
				}
			}()
			member.Register(bad.prefix, bad.k)
		}()
	}
}

// TestUnknownKind: a spec of the form scheme://... of no registered kind (a typo of one) is
// refused by Open and MapSpecPath with an UnknownKindError naming it and the registered kinds,
// never fs.ErrNotExist (which the array would count as a missing member) and never opened as a
// path; SpecPath says it has no local file. A path with "://" past its first component is a path.
func TestUnknownKind(t *testing.T) {
	registerOnce.Do(registerTestKinds)
	for _, spec := range []string{"regtets://host/export", "nbd+unx:///export?socket=/s", "x.y-z+1://a"} {
		m, err := member.Open(spec, member.Exclusive)
		var uk *member.UnknownKindError
		if m != nil || !errors.Is(err, member.ErrUnknownKind) || errors.Is(err, fs.ErrNotExist) || !errors.As(err, &uk) {
			t.Fatalf("Open(%q) = %v, %v; want an UnknownKindError", spec, m, err)
		}
		if uk.Spec != spec || !slices.Contains(uk.Kinds, "regtest://") || !slices.IsSorted(uk.Kinds) {
			t.Errorf("Open(%q): the error names %q and the kinds %q; want the spec and the registered kinds, sorted", spec, uk.Spec, uk.Kinds)
		}
		if p := member.SpecPath(spec); p != "" {
			t.Errorf("SpecPath(%q) = %q, want \"\" (no local file)", spec, p)
		}
		called := false
		got, err := member.MapSpecPath(spec, func(p string) (string, error) { called = true; return "/abs/" + p, nil })
		if got != spec || called || !errors.As(err, &uk) {
			t.Errorf("MapSpecPath(%q) = %q, %v (f called: %v); want the spec unchanged and an UnknownKindError", spec, got, err, called)
		}
	}
	dir := t.TempDir()
	for _, path := range []string{filepath.Join(dir, "a://b"), "1x://absent", "://absent"} {
		if _, err := member.Open(path, member.Exclusive); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Open(%q) = %v, want fs.ErrNotExist (a path)", path, err)
		}
	}
}
