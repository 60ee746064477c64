package faulty

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/raid5d/raid5d/raid/member"
)

// Prefix starts a member spec that wraps a member in fault injection, a testing aid
// (package doc # Specs): faulty:PATH?key=value&... The key volatile (a flag) keeps the
// member's writes in memory until it is synced, so that killing the process loses what a
// power cut would (see Volatile).
const Prefix = "faulty:"

// VolatilePrefix starts the short spelling of a volatile member spec: volatile:PATH is
// faulty:PATH?volatile, and volatile:PATH?key=value&... is faulty:PATH?volatile&key=value&...
// The crash tests use it for every member (and a journal) of a power-cut loop.
const VolatilePrefix = "volatile:"

// Register registers the faulty: and volatile: kinds of member (member.Register), so that
// member.Open — and so raid.OpenMember, Create, Assemble, AddSpare and a journal path — opens
// their specs. dataOffset is where the array's data area begins on a member (raid.DataOffset):
// the range "all" of the keys rfail, wfail and drop starts there, so that superblocks stay
// readable. cmd/raid5d registers them; so do the tests that use specs. Call it once.
func Register(dataOffset int64) {
	k := member.Kind{
		Open: func(spec string, use member.Use) (member.Member, error) {
			prefix, path, query, _ := splitSpec(spec)
			return openSpec(spec, path, query, prefix == VolatilePrefix, use, dataOffset)
		},
		Path:    specFile,
		MapPath: mapSpecFile,
	}
	member.Register(Prefix, k)
	member.Register(VolatilePrefix, k)
}

// splitSpec splits a member spec into its prefix (Prefix, VolatilePrefix, or "" for a plain
// path), the path it opens, and its query (after '?'; hasQuery says whether there was a '?').
// A plain path is returned whole, '?' and all.
func splitSpec(spec string) (prefix, path, query string, hasQuery bool) {
	for _, p := range []string{Prefix, VolatilePrefix} {
		if rest, ok := strings.CutPrefix(spec, p); ok {
			path, query, hasQuery = strings.Cut(rest, "?")
			return p, path, query, hasQuery
		}
	}
	return "", spec, "", false
}

// specFile is the file a faulty: or volatile: spec opens (Kind.Path): its PATH.
func specFile(spec string) string {
	_, path, _, _ := splitSpec(spec)
	return path
}

// mapSpecFile returns spec with its PATH replaced by f(PATH), its prefix and keys unchanged
// (Kind.MapPath).
func mapSpecFile(spec string, f func(string) (string, error)) (string, error) {
	prefix, path, query, hasQuery := splitSpec(spec)
	path, err := f(path)
	if err != nil {
		return "", err
	}
	if hasQuery {
		return prefix + path + "?" + query, nil
	}
	return prefix + path, nil
}

// byteRange is [off, off+n) of a member.
type byteRange struct{ off, n int64 }

// openSpec opens path with the faults of query (the keys of a faulty: spec), volatile from
// the start for the volatile: spelling; spec is the whole spec, for errors. A spec without a
// path is an error of its own, never fs.ErrNotExist, which Assemble would take for a missing
// member. The faults become a Member's Faults: wfail before drop (a write both select fails),
// every one gated by the spec's after and ctl (specGate).
func openSpec(spec, path, query string, volatile bool, use member.Use, dataOffset int64) (member.Member, error) {
	if path == "" {
		return nil, fmt.Errorf("faulty: member spec %q: no path (want %sPATH?key=value&... or %sPATH?key=value&...)",
			spec, Prefix, VolatilePrefix)
	}
	short := volatile // the volatile: spelling: the key is implied
	var (
		rfail, wfail, drop []byteRange
		g                  specGate
		delay              time.Duration
		err                error
	)
	for kv := range strings.SplitSeq(query, "&") {
		if kv == "" {
			continue
		}
		key, v, _ := strings.Cut(kv, "=")
		if v, err = url.PathUnescape(v); err != nil { // not QueryUnescape: '+' stays '+'
			return nil, fmt.Errorf("faulty: member spec %q: %w", spec, err)
		}
		{
			switch key {
			case "rfail", "wfail", "drop":
				r, err := parseByteRange(v, dataOffset)
				if err != nil {
					return nil, fmt.Errorf("faulty: member spec %q: %s: %w", spec, key, err)
				}
				switch key {
				case "rfail":
					rfail = append(rfail, r)
				case "wfail":
					wfail = append(wfail, r)
				default:
					drop = append(drop, r)
				}
			case "after":
				if g.after, err = strconv.ParseInt(v, 10, 64); err != nil || g.after < 0 {
					return nil, fmt.Errorf("faulty: member spec %q: after=%q", spec, v)
				}
			case "delay":
				if delay, err = time.ParseDuration(v); err != nil {
					return nil, fmt.Errorf("faulty: member spec %q: %w", spec, err)
				}
			case "ctl":
				g.ctl = v
			case "volatile":
				if short {
					return nil, fmt.Errorf("faulty: member spec %q: key volatile: the %s spelling is volatile already", spec, VolatilePrefix)
				}
				if volatile, err = parseFlag(v); err != nil {
					return nil, fmt.Errorf("faulty: member spec %q: volatile=%q: %w", spec, v, err)
				}
			default:
				return nil, fmt.Errorf("faulty: member spec %q: unknown key %q", spec, key)
			}
		}
	}
	m, err := member.Open(path, use) // locked like PATH itself
	if err != nil {
		return nil, err
	}
	if volatile {
		m = NewVolatile(m)
	}
	fm := New(m)
	for _, f := range []struct {
		op   Op
		rs   []byteRange
		drop bool
	}{{OpRead, rfail, false}, {OpWrite, wfail, false}, {OpWrite, drop, true}} {
		for _, r := range f.rs {
			if r.n > 0 { // an empty range touches nothing (a Fault with Len 0 would select all)
				fm.faults = append(fm.faults, Fault{Op: f.op, Off: r.off, Len: r.n, Drop: f.drop})
				fm.seen = append(fm.seen, 0)
			}
		}
	}
	fm.delay = delay
	if g.ctl != "" || g.after > 0 {
		fm.gate = g.armed
	}
	if g.ctl != "" {
		fm.delayGate = g.controlled
	}
	return fm, nil
}

// specGate holds a spec's after and ctl keys.
type specGate struct {
	after int64        // operations selected by a fault that pass before faults fire
	ops   atomic.Int64 // operations selected so far
	ctl   string       // faults (and delay) fire only while this file exists ("" = always)
}

// armed reports whether faults fire for this operation, which a fault selects: after the first
// after such operations, and while the control file exists.
func (g *specGate) armed() bool {
	if g.ops.Add(1) <= g.after {
		return false
	}
	return g.controlled()
}

// controlled reports whether the control file exists (true without one): a member can start
// failing, or hanging, after assembly.
func (g *specGate) controlled() bool {
	if g.ctl == "" {
		return true
	}
	_, err := os.Stat(g.ctl)
	return err == nil
}

// parseFlag parses a flag key's value: empty (the key alone) means true.
func parseFlag(v string) (bool, error) {
	if v == "" {
		return true, nil
	}
	return strconv.ParseBool(v)
}

// parseByteRange parses "OFF+LEN" (sizes with an optional K, M, G or T suffix, powers of
// 1024) or "all" (the data area: from dataOffset to the end).
func parseByteRange(s string, dataOffset int64) (byteRange, error) {
	if s == "all" {
		return byteRange{dataOffset, 1 << 62}, nil
	}
	o, n, ok := strings.Cut(s, "+")
	if !ok {
		return byteRange{}, errors.New("want OFF+LEN or all")
	}
	off, err1 := parseSize(o)
	length, err2 := parseSize(n)
	if err := errors.Join(err1, err2); err != nil {
		return byteRange{}, err
	}
	return byteRange{off, length}, nil
}

func parseSize(s string) (int64, error) {
	mul := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'K', 'k':
			mul = 1 << 10
		case 'M', 'm':
			mul = 1 << 20
		case 'G', 'g':
			mul = 1 << 30
		case 'T', 't':
			mul = 1 << 40
		}
		if mul > 1 {
			s = s[:len(s)-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mul, nil
}
