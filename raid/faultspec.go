package raid

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	memberpkg "github.com/raid5d/raid5d/raid/member"
)

// FaultySpecPrefix starts a member spec that wraps a member in fault injection, a testing aid
// (doc.go # Testing with faulty members): faulty:PATH?key=value&... The key volatile (a
// flag) keeps the member's writes in memory until it is synced, so that killing the process
// loses what a power cut would (see volatileMember).
const FaultySpecPrefix = "faulty:"

// VolatileSpecPrefix starts the short spelling of a volatile member spec: volatile:PATH is
// faulty:PATH?volatile, and volatile:PATH?key=value&... is faulty:PATH?volatile&key=value&...
// The crash tests use it for every member (and a journal) of a power-cut loop.
const VolatileSpecPrefix = "volatile:"

// splitSpec splits a member spec into its prefix (FaultySpecPrefix, VolatileSpecPrefix, or ""
// for a plain path), the path it opens, and its query (after '?'; hasQuery says whether there
// was a '?'). A plain path is returned whole, '?' and all.
func splitSpec(spec string) (prefix, path, query string, hasQuery bool) {
	for _, p := range []string{FaultySpecPrefix, VolatileSpecPrefix} {
		if rest, ok := strings.CutPrefix(spec, p); ok {
			path, query, hasQuery = strings.Cut(rest, "?")
			return p, path, query, hasQuery
		}
	}
	return "", spec, "", false
}

// The faulty: and volatile: kinds of member (memberpkg.Register).
func init() {
	for _, prefix := range []string{FaultySpecPrefix, VolatileSpecPrefix} {
		memberpkg.Register(prefix, memberpkg.Kind{Open: openSpec, Path: specFile, MapPath: mapSpecFile})
	}
}

// specFile is the file a faulty: or volatile: spec opens: its PATH.
func specFile(spec string) string {
	_, path, _, _ := splitSpec(spec)
	return path
}

// mapSpecFile returns spec with its PATH replaced by f(PATH), its prefix and keys unchanged.
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

// openSpec opens a member spec, faulty: or volatile:.
func openSpec(spec string, use memberUse) (Member, error) {
	prefix, path, query, _ := splitSpec(spec)
	return openFaultySpec(spec, path, query, prefix == VolatileSpecPrefix, use)
}

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

// openFaultySpec opens path with the faults of query (the keys of a faulty: spec), volatile
// from the start for the volatile: spelling; spec is the whole spec, for errors. A spec
// without a path is an error of its own, never fs.ErrNotExist, which Assemble would take for a
// missing member.
func openFaultySpec(spec, path, query string, volatile bool, use memberUse) (Member, error) {
	if path == "" {
		return nil, fmt.Errorf("raid: member spec %q: no path (want %sPATH?key=value&... or %sPATH?key=value&...)",
			spec, FaultySpecPrefix, VolatileSpecPrefix)
	}
	short := volatile // the volatile: spelling: the key is implied
	sm := &specMember{}
	var err error
	for kv := range strings.SplitSeq(query, "&") {
		if kv == "" {
			continue
		}
		key, v, _ := strings.Cut(kv, "=")
		if v, err = url.PathUnescape(v); err != nil { // not QueryUnescape: '+' stays '+'
			return nil, fmt.Errorf("raid: member spec %q: %w", spec, err)
		}
		{
			switch key {
			case "rfail", "wfail", "drop":
				r, err := parseByteRange(v)
				if err != nil {
					return nil, fmt.Errorf("raid: member spec %q: %s: %w", spec, key, err)
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
					return nil, fmt.Errorf("raid: member spec %q: after=%q", spec, v)
				}
			case "delay":
				if sm.delay, err = time.ParseDuration(v); err != nil {
					return nil, fmt.Errorf("raid: member spec %q: %w", spec, err)
				}
			case "ctl":
				sm.ctl = v
			case "volatile":
				if short {
					return nil, fmt.Errorf("raid: member spec %q: key volatile: the %s spelling is volatile already", spec, VolatileSpecPrefix)
				}
				if volatile, err = parseFlag(v); err != nil {
					return nil, fmt.Errorf("raid: member spec %q: volatile=%q: %w", spec, v, err)
				}
			default:
				return nil, fmt.Errorf("raid: member spec %q: unknown key %q", spec, key)
			}
		}
	}
	m, err := openMember(path, use) // locked like PATH itself
	if err != nil {
		return nil, err
	}
	if volatile {
		m = newVolatileMember(m)
	}
	sm.Member = m
	return sm, nil
}

// parseFlag parses a flag key's value: empty (the key alone) means true.
func parseFlag(v string) (bool, error) {
	if v == "" {
		return true, nil
	}
	return strconv.ParseBool(v)
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

// delaying reports whether reads and writes sleep delay first: always, or with a control file
// only while it exists (so a member can start hanging after assembly).
func (m *specMember) delaying() bool {
	if m.delay <= 0 {
		return false
	}
	if m.ctl != "" {
		if _, err := os.Stat(m.ctl); err != nil {
			return false
		}
	}
	return true
}

func (m *specMember) ReadAt(p []byte, off int64) (int, error) {
	if m.delaying() {
		time.Sleep(m.delay)
	}
	if hits(m.rfail, off, int64(len(p))) && m.armed() {
		return 0, fmt.Errorf("%w: read %s at %d", errInjected, m.Name(), off)
	}
	return m.Member.ReadAt(p, off)
}

func (m *specMember) WriteAt(p []byte, off int64) (int, error) {
	if m.delaying() {
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

// volatilePage is the granularity of a volatile member's write cache: a page reaches the file
// whole or not at all, as a 4 KiB sector of a disk that does not tear its sectors.
const volatilePage = 4096

// volatileMember keeps every write (and trim) in the process's memory, in whole pages, until a
// Sync; Sync then writes the batch to the member underneath page by page in a random order and
// fdatasyncs it. Killing the process therefore loses exactly what a power cut loses on a disk
// with a volatile write cache that reorders its writes: every write not synced, and of a Sync
// in progress any subset of its pages. Close without a Sync also drops the unsynced pages. It
// is a testing tool (faulty:PATH?volatile), never a way to run an array: the cache grows
// with the writes between syncs, and a page written in a Sync batch costs a pwrite of its own.
// Reads see the cache over the batch being synced over the file, like a disk. Safe for
// concurrent use.
type volatileMember struct {
	Member // the member underneath: holds what survives a kill

	syncMu sync.Mutex // serialises Sync and Close; guards rng
	rng    *rand.Rand

	mu sync.RWMutex // guards cache, flushing, closed
	// cache holds the pages written since the last Sync began; flushing the batch a running
	// Sync is writing out (nil when none runs). A page is a volatilePage slice (shorter at the
	// end of the member), or nil for a page trimmed whole.
	cache    map[int64][]byte
	flushing map[int64][]byte
	closed   bool
}

// errVolatileClosed is returned by a volatile member's methods after Close.
var errVolatileClosed = errors.New("raid: volatile member is closed")

func newVolatileMember(m Member) *volatileMember {
	return &volatileMember{
		Member: m,
		rng:    rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		cache:  map[int64][]byte{},
	}
}

// pageLen is the length of page pg (the last page of a member may be short).
func (v *volatileMember) pageLen(pg int64) int64 {
	return min(volatilePage, v.Size()-pg*volatilePage)
}

// lookup returns the newest unsynced contents of page pg (nil and true for a trimmed page), or
// false if the file holds it. v.mu is held.
func (v *volatileMember) lookup(pg int64) ([]byte, bool) {
	if c, ok := v.cache[pg]; ok {
		return c, true
	}
	c, ok := v.flushing[pg]
	return c, ok
}

func (v *volatileMember) checkRange(op string, off, n int64) error {
	if v.closed {
		return fmt.Errorf("%w: %s %s at %d", errVolatileClosed, op, v.Name(), off)
	}
	if off < 0 || n < 0 || off+n > v.Size() {
		return fmt.Errorf("raid: volatile member %s: %s [%d, %d) outside member of %d bytes", v.Name(), op, off, off+n, v.Size())
	}
	return nil
}

// ReadAt reads the cache over the batch being synced over the file; runs of pages that only
// the file holds are read with one call.
func (v *volatileMember) ReadAt(p []byte, off int64) (int, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if err := v.checkRange("read", off, int64(len(p))); err != nil {
		return 0, err
	}
	run := int64(0) // bytes of p from here back that the file holds, not read yet
	readRun := func(end int64) error {
		if run == 0 {
			return nil
		}
		_, err := v.Member.ReadAt(p[end-run:end], off+end-run)
		run = 0
		return err
	}
	for n := int64(0); n < int64(len(p)); {
		pg, in := (off+n)/volatilePage, (off+n)%volatilePage
		k := min(volatilePage-in, int64(len(p))-n)
		c, ok := v.lookup(pg)
		if !ok {
			run += k
			n += k
			continue
		}
		if err := readRun(n); err != nil {
			return 0, err
		}
		if c == nil {
			clear(p[n : n+k])
		} else {
			copy(p[n:n+k], c[in:])
		}
		n += k
	}
	if err := readRun(int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// put writes p (nil: zeroes) into the cache at off; v.mu is held for writing.
func (v *volatileMember) put(p []byte, off, length int64) error {
	for n := int64(0); n < length; {
		pg, in := (off+n)/volatilePage, (off+n)%volatilePage
		k := min(volatilePage-in, length-n)
		whole := in == 0 && k == v.pageLen(pg)
		if whole && p == nil {
			v.cache[pg] = nil // trimmed whole
			n += k
			continue
		}
		c, cached := v.cache[pg]
		if c == nil { // absent, or trimmed whole: start from the newest contents
			c = make([]byte, v.pageLen(pg))
			switch old, ok := v.lookup(pg); {
			case cached || whole: // trimmed (zeroes), or about to be overwritten whole
			case ok:
				if old != nil {
					copy(c, old)
				}
			default:
				if _, err := v.Member.ReadAt(c, pg*volatilePage); err != nil {
					return err
				}
			}
			v.cache[pg] = c
		}
		if p != nil {
			copy(c[in:in+k], p[n:])
		} else {
			clear(c[in : in+k])
		}
		n += k
	}
	return nil
}

// WriteAt puts p in the cache: it reaches the file at the next Sync, or never.
func (v *volatileMember) WriteAt(p []byte, off int64) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.checkRange("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	if err := v.put(p, off, int64(len(p))); err != nil {
		return 0, fmt.Errorf("raid: volatile member %s: write at %d: reading the page underneath: %w", v.Name(), off, err)
	}
	return len(p), nil
}

// Trim zeroes [off, off+length) in the cache: as volatile as a write. Pages trimmed whole
// are punched out of the file (Member.Trim) when synced.
func (v *volatileMember) Trim(off, length int64) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.checkRange("trim", off, length); err != nil {
		return err
	}
	if err := v.put(nil, off, length); err != nil {
		return fmt.Errorf("raid: volatile member %s: trim at %d: reading the page underneath: %w", v.Name(), off, err)
	}
	return nil
}

// Sync writes the pages cached so far to the file in a random order, then fdatasyncs it.
// Writes that arrive meanwhile go to the next batch. If a page cannot be written, the pages
// not yet written stay cached (unless rewritten since) and the error is returned.
func (v *volatileMember) Sync() error {
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return fmt.Errorf("%w: sync %s", errVolatileClosed, v.Name())
	}
	batch := v.cache
	v.cache, v.flushing = map[int64][]byte{}, batch
	v.mu.Unlock()

	pages := make([]int64, 0, len(batch))
	for pg := range batch {
		pages = append(pages, pg)
	}
	slices.Sort(pages) // map order is not a seeded shuffle; this and rng make one
	v.rng.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
	var err error
	done := 0
	for _, pg := range pages {
		if c := batch[pg]; c != nil {
			_, err = v.Member.WriteAt(c, pg*volatilePage)
		} else {
			err = v.Member.Trim(pg*volatilePage, v.pageLen(pg))
		}
		if err != nil {
			break
		}
		done++
	}
	if err == nil {
		err = v.Member.Sync()
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.flushing = nil
	if err != nil {
		for _, pg := range pages[done:] {
			if _, rewritten := v.cache[pg]; !rewritten {
				v.cache[pg] = batch[pg]
			}
		}
		return fmt.Errorf("raid: volatile member %s: sync: %w", v.Name(), err)
	}
	return nil
}

// Close drops the pages not synced, as a power cut would, and closes the member underneath.
func (v *volatileMember) Close() error {
	v.syncMu.Lock()
	defer v.syncMu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return fmt.Errorf("%w: close %s", errVolatileClosed, v.Name())
	}
	v.closed, v.cache = true, nil
	return v.Member.Close()
}
