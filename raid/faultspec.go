package raid

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// FaultySpecPrefix starts a member spec that wraps a member in fault injection, a testing aid
// (doc.go # Testing with faulty members): faulty:PATH?key=value&...
const FaultySpecPrefix = "faulty:"

// errInjected is what a faulty: member's injected faults return (EIO, like a failing disk).
var errInjected error = &ioError{"raid: injected fault (faulty: member)", uint32(unix.EIO)}

// byteRange is [off, off+n) of a member.
type byteRange struct{ off, n int64 }

func (r byteRange) touches(off, n int64) bool { return off < r.off+r.n && r.off < off+n }

// specMember is a Member that injects the faults of a faulty: spec.
type specMember struct {
	Member
	rfail, wfail, drop []byteRange
	after              int64 // data operations that pass before faults fire
	ops                atomic.Int64
	delay              time.Duration
	ctl                string // faults fire only while this file exists ("" = always)
}

// openFaultySpec parses spec (after FaultySpecPrefix) and opens its member.
func openFaultySpec(spec string, readOnly bool) (Member, error) {
	path, query, _ := strings.Cut(spec, "?")
	sm := &specMember{}
	var err error
	for kv := range strings.SplitSeq(query, "&") {
		if kv == "" {
			continue
		}
		key, v, _ := strings.Cut(kv, "=")
		if v, err = url.PathUnescape(v); err != nil { // not QueryUnescape: '+' stays '+'
			return nil, fmt.Errorf("raid: faulty member spec %q: %w", spec, err)
		}
		{
			switch key {
			case "rfail", "wfail", "drop":
				r, err := parseByteRange(v)
				if err != nil {
					return nil, fmt.Errorf("raid: faulty member spec %q: %s: %w", spec, key, err)
				}
				switch key {
				case "rfail":
					sm.rfail = append(sm.rfail, r)
				case "wfail":
					sm.wfail = append(sm.wfail, r)
				default:
					sm.drop = append(sm.drop, r)
				}
			case "after":
				if sm.after, err = strconv.ParseInt(v, 10, 64); err != nil || sm.after < 0 {
					return nil, fmt.Errorf("raid: faulty member spec %q: after=%q", spec, v)
				}
			case "delay":
				if sm.delay, err = time.ParseDuration(v); err != nil {
					return nil, fmt.Errorf("raid: faulty member spec %q: %w", spec, err)
				}
			case "ctl":
				sm.ctl = v
			default:
				return nil, fmt.Errorf("raid: faulty member spec %q: unknown key %q", spec, key)
			}
		}
	}
	m, err := OpenMember(path, readOnly)
	if err != nil {
		return nil, err
	}
	sm.Member = m
	return sm, nil
}

// parseByteRange parses "OFF+LEN" (sizes with an optional K, M, G or T suffix, powers of
// 1024) or "all" (the data area: from DataOffset to the end).
func parseByteRange(s string) (byteRange, error) {
	if s == "all" {
		return byteRange{DataOffset, 1 << 62}, nil
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

// armed reports whether faults fire for this operation (after the first after ops, and while
// the control file exists).
func (m *specMember) armed() bool {
	if m.ops.Add(1) <= m.after {
		return false
	}
	if m.ctl != "" {
		if _, err := os.Stat(m.ctl); err != nil {
			return false
		}
	}
	return true
}

func hits(rs []byteRange, off, n int64) bool {
	for _, r := range rs {
		if r.touches(off, n) {
			return true
		}
	}
	return false
}

func (m *specMember) ReadAt(p []byte, off int64) (int, error) {
	if m.delay > 0 {
		time.Sleep(m.delay)
	}
	if hits(m.rfail, off, int64(len(p))) && m.armed() {
		return 0, fmt.Errorf("%w: read %s at %d", errInjected, m.Name(), off)
	}
	return m.Member.ReadAt(p, off)
}

func (m *specMember) WriteAt(p []byte, off int64) (int, error) {
	if m.delay > 0 {
		time.Sleep(m.delay)
	}
	if (hits(m.wfail, off, int64(len(p))) || hits(m.drop, off, int64(len(p)))) && m.armed() {
		if hits(m.wfail, off, int64(len(p))) {
			return 0, fmt.Errorf("%w: write %s at %d", errInjected, m.Name(), off)
		}
		return len(p), nil // dropped silently
	}
	return m.Member.WriteAt(p, off)
}
