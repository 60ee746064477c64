package raid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/raid/internal/bitmap"
	"github.com/raid5d/raid5d/raid/internal/journal"
	"github.com/raid5d/raid5d/stripe"
)

// Consistency policies (CreateOptions.Consistency).
const (
	ConsistencyBitmap  = "bitmap"
	ConsistencyNone    = "none"
	ConsistencyJournal = "journal"
)

// CreateOptions configure Create. The zero value is a valid default.
type CreateOptions struct {
	Chunk      int64  // chunk size in bytes; 0 = stripe.DefaultChunk
	Layout     string // md layout name or short form (stripe.ParseAlgorithm); "" = stripe.DefaultAlgorithm
	MemberSize int64  // if > 0, absent member files are created, sparse, with this size
	Force      bool   // overwrite members that already carry a raid5d superblock
	// Spares are paths of spare members (created like members with MemberSize), added after
	// the array is created (AddSpare).
	Spares []string
	// BitmapRegion is how many array bytes each bit of the write-intent bitmap covers,
	// rounded up to a power-of-two number of stripes: 0 the default (the smallest such that
	// the bitmap has at most DefaultBitmapBits bits); < 0 no bitmap (every unclean shutdown
	// then resyncs the whole array). ErrBitmapRegion if the bitmap would not fit.
	BitmapRegion int64
	// Consistency is the policy for crash consistency: "" or ConsistencyBitmap (the default:
	// the write-intent bitmap; after a crash only its regions are resynced), ConsistencyNone
	// (no bitmap, as BitmapRegion < 0: a crash resyncs everything), ConsistencyJournal (a
	// write journal on a separate device, Journal or JournalPath: every stripe write is
	// logged first and replayed after a crash, which closes the write hole of a crash while
	// degraded; no bitmap, no resync; it costs the journal write and a sync per group of
	// writes). "ppl" is not implemented: ErrConsistency. See doc.go # Crash consistency.
	Consistency string
	// Journal is the journal device for ConsistencyJournal, already open (tests: raidtest
	// members); the superblocks record its Name. On success the array owns it.
	Journal Member
	// JournalPath is the journal's file or block device for ConsistencyJournal when Journal is
	// nil (with Journal: the name to record, default Journal.Name()). A file that does not exist is created with JournalSize bytes; an
	// existing file or device is used whole. The superblocks record the absolute path.
	JournalPath string
	// JournalSize is the size of a journal file Create makes: 0 means DefaultJournalSize.
	// Smaller than JournalMinSize of the layout: ErrJournal.
	JournalSize int64
	IOOptions   // stripe cache, stable pages, failure handling for the returned array
}

// Create makes a new array of the members at paths (role i is paths[i]), writes their
// superblocks and returns the open array, clean. Members of unequal size contribute the
// smallest one's data size. Each member's data area is made to read as zeroes (Member.Trim), so
// parity is consistent from the start without an initial sync.
func Create(paths []string, opts CreateOptions) (a *Array, err error) {
	if err := checkDistinct(append(paths[:len(paths):len(paths)], opts.Spares...)); err != nil {
		return nil, err
	}
	// Refuse bad options before any file is created.
	l, err := opts.layout(len(paths))
	if err != nil {
		return nil, err
	}
	if opts.Consistency == ConsistencyJournal && opts.Journal == nil {
		if opts.JournalSize == 0 {
			opts.JournalSize = DefaultJournalSize
		}
		if _, serr := os.Stat(SpecPath(opts.JournalPath)); errors.Is(serr, fs.ErrNotExist) && opts.JournalSize < JournalMinSize(l) {
			return nil, fmt.Errorf("%w: journal size %d; this layout needs at least %d", ErrJournal, opts.JournalSize, JournalMinSize(l))
		}
	}
	var created []string // member files made here: removed again if Create fails
	defer func() {
		if err != nil {
			for _, p := range created {
				os.Remove(p)
			}
		}
	}()
	if opts.Consistency == ConsistencyJournal && opts.Journal == nil && opts.JournalPath != "" {
		// Before the journal is opened: on a member's file it would lock the member.
		if err := checkJournalPlacement(opts.JournalPath, append(paths[:len(paths):len(paths)], opts.Spares...)); err != nil {
			return nil, err
		}
		jm, made, err := openJournalFile(opts.JournalPath, opts.JournalSize)
		if made {
			created = append(created, SpecPath(opts.JournalPath))
		}
		if err != nil {
			return nil, err
		}
		abs, err := MapSpecPath(opts.JournalPath, filepath.Abs)
		if err != nil {
			jm.Close()
			return nil, err
		}
		opts.Journal, opts.JournalPath = jm, abs
		defer func() {
			if err != nil {
				jm.Close()
			}
		}()
	}
	members := make([]Member, 0, len(paths))
	for _, p := range append(paths[:len(paths):len(paths)], opts.Spares...) {
		if opts.MemberSize > 0 && SpecPath(p) != "" { // a remote member ("") is not made
			if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
				if err := createMemberFile(p, opts.MemberSize); err != nil {
					closeMembers(members)
					return nil, &MemberError{Member: p, Role: len(members), Op: "create", Off: -1, Err: err}
				}
				created = append(created, p)
			}
		}
		m, err := OpenMember(p, false)
		if err != nil {
			closeMembers(members)
			return nil, &MemberError{Member: p, Role: len(members), Op: "open", Off: -1, Err: err}
		}
		members = append(members, m)
	}
	if opts.Journal != nil {
		// Spares too: CreateMembers sees only the members. Nothing is written yet.
		if err := checkJournalPlacement(opts.Journal.Name(), memberNames(members)); err != nil {
			closeMembers(members)
			return nil, err
		}
	}
	spares := members[len(paths):]
	if !opts.Force {
		// CreateMembers checks the members; the spares are checked here, before anything
		// is written, so AddSpareMember need not check them again.
		for _, m := range spares {
			if sb, err := readSuperblock(m); err == nil {
				closeMembers(members)
				return nil, &MemberError{Member: m.Name(), Role: -1, Op: "create", Off: SuperblockOffset,
					Err: fmt.Errorf("%w: role %d of array %s (use Force to overwrite)", ErrInUse, sb.Role, sb.ArrayUUID)}
			}
		}
	}
	a, err = CreateMembers(members[:len(paths)], opts)
	if err != nil {
		closeMembers(members)
		return nil, err
	}
	for i, m := range spares {
		if err := a.AddSpareMember(m, Force); err != nil {
			closeMembers(spares[i:])
			a.Close()
			return nil, err
		}
	}
	return a, nil
}

// layout checks the options that do not depend on the members (consistency policy, chunk size,
// layout name) and returns the geometry of an array of n members.
func (opts *CreateOptions) layout(n int) (stripe.Layout, error) {
	switch opts.Consistency {
	case "", ConsistencyBitmap, ConsistencyNone:
	case ConsistencyJournal:
		if opts.Journal == nil && opts.JournalPath == "" {
			return stripe.Layout{}, fmt.Errorf("%w: the journal policy needs a journal (a file or device: JournalPath, --journal)", ErrConsistency)
		}
		if len(opts.JournalPath) > MaxJournalPath || opts.Journal != nil && len(opts.Journal.Name()) > MaxJournalPath {
			return stripe.Layout{}, fmt.Errorf("%w: journal path longer than %d bytes", ErrJournal, MaxJournalPath)
		}
	default:
		return stripe.Layout{}, fmt.Errorf("%w: %q", ErrConsistency, opts.Consistency)
	}
	chunk := opts.Chunk
	if chunk == 0 {
		chunk = stripe.DefaultChunk
	}
	alg := stripe.DefaultAlgorithm
	if opts.Layout != "" {
		var err error
		if alg, err = stripe.ParseAlgorithm(opts.Layout); err != nil {
			return stripe.Layout{}, err
		}
	}
	return stripe.NewLayout(n, chunk, alg)
}

// CreateMembers is Create on members already open (role i is members[i]), such as raidtest's
// in-memory members. On success the array owns the members and closes them on Close; on error
// the caller still owns them. opts.MemberSize is ignored.
func CreateMembers(members []Member, opts CreateOptions) (*Array, error) {
	layout, err := opts.layout(len(members))
	if err != nil {
		return nil, err
	}
	if opts.Consistency == ConsistencyNone || opts.Consistency == ConsistencyJournal {
		opts.BitmapRegion = -1 // the journal needs no bitmap: a crash replays, never resyncs
	}
	jm := opts.Journal
	if opts.Consistency == ConsistencyJournal {
		if err := checkJournalPlacement(jm.Name(), memberNames(members)); err != nil {
			return nil, err
		}
		if need := JournalMinSize(layout); jm.Size() < need {
			return nil, fmt.Errorf("%w: %s: %d bytes; this layout needs a journal of at least %d (two headers and four whole-stripe records)",
				ErrJournal, jm.Name(), jm.Size(), need)
		}
		if owner, ok := journalOwner(jm); ok && !opts.Force {
			return nil, fmt.Errorf("%w: %s is the journal of array %s (use Force to overwrite)", ErrInUse, jm.Name(), owner)
		}
	}
	chunk := layout.ChunkSize()
	need := int64(DataOffset + MinDataChunks*chunk)
	smallest := int64(-1)
	for r, m := range members {
		if m.Size() < need {
			return nil, &MemberError{Member: m.Name(), Role: r, Op: "create", Off: -1,
				Err: fmt.Errorf("%w: %d bytes; a member needs at least %d (%d for the superblock area plus %d chunks of %d)",
					ErrMemberTooSmall, m.Size(), need, DataOffset, MinDataChunks, chunk)}
		}
		if smallest < 0 || m.Size() < smallest {
			smallest = m.Size()
		}
	}
	dataSize := (smallest - DataOffset) / chunk * chunk
	if !opts.Force {
		for r, m := range members {
			if sb, err := readSuperblock(m); err == nil {
				return nil, &MemberError{Member: m.Name(), Role: r, Op: "create", Off: SuperblockOffset,
					Err: fmt.Errorf("%w: role %d of array %s (use Force to overwrite)", ErrInUse, sb.Role, sb.ArrayUUID)}
			}
		}
	}
	// Zero everything after the first 4 KiB up to the end of the data area, concurrently:
	// zero data has zero parity, so the array is consistent by construction.
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for r, m := range members {
		wg.Go(func() {
			n := DataOffset + dataSize - SuperblockOffset
			errs[r] = memberErr(m, r, "zero", SuperblockOffset, m.Trim(SuperblockOffset, n))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	arrayUUID, now := newUUID(), time.Now()
	var features uint32
	var bmOff, bmSize, bmRegion int64
	if opts.BitmapRegion >= 0 {
		stripes := dataSize / chunk
		bmRegion = bitmapRegionStripes(stripes, layout.StripeSize(), opts.BitmapRegion)
		features, bmOff, bmSize = featureBitmap, BitmapOffset, bitmapBytes((stripes+bmRegion-1)/bmRegion)
		if bmSize > MaxBitmapBytes {
			return nil, fmt.Errorf("%w: %d bytes per bit make %d bytes, the area holds %d", ErrBitmapRegion,
				bmRegion*layout.StripeSize(), bmSize, MaxBitmapBytes)
		}
	}
	var jh *journal.Header
	jpath := ""
	if jm != nil && opts.Consistency == ConsistencyJournal {
		if jh, err = journal.Init(jm, arrayUUID); err != nil {
			return nil, err
		}
		features |= featureJournal
		if jpath = opts.JournalPath; jpath == "" {
			jpath = jm.Name()
		}
	}
	roles := make([]*member, len(members))
	for r, m := range members {
		roles[r] = newMember(m, &superblock{
			ArrayUUID: arrayUUID, DeviceUUID: newUUID(), Level: level5, Layout: layout.Algorithm(), Chunk: chunk,
			Members: len(members), Role: r, DataOffset: DataOffset, DataSize: dataSize, Created: now,
			Features: features, BitmapOff: bmOff, BitmapSize: bmSize, BitmapRegion: bmRegion, JournalPath: jpath,
		})
	}
	a, err := newArray(layout, roles, nil, false, nil, opts.IOOptions)
	if err != nil {
		return nil, err
	}
	if jh != nil {
		a.jr = newJournal(a, jm, jpath, jh)
	}
	a.sbMu.Lock()
	err = a.writeSuperblocks(func(*superblock) {})
	a.sbMu.Unlock()
	if err != nil {
		return nil, err
	}
	for r, m := range roles { // now that their exports carry their superblocks
		if err := checkConns(m, arrayUUID, m.sb.DeviceUUID, r, "create"); err != nil {
			return nil, err
		}
	}
	a.startJournal()
	a.start()
	return a, nil
}

// startJournal starts the journal's checkpointer (writable arrays with a journal); Close
// stops it.
func (a *Array) startJournal() {
	if a.jr != nil && !a.jr.Missing() && !a.readOnly {
		a.bgWG.Go(a.jr.Run)
	}
}

// openJournalFile opens the journal at path, creating it with size bytes (0:
// DefaultJournalSize; Create has checked it) if it does not exist; made says whether it did.
// path may be a member spec (volatile:PATH: a journal that loses its unsynced writes when the
// process is killed, to test the journal's own crash safety); then the file made is PATH.
func openJournalFile(path string, size int64) (m Member, made bool, err error) {
	if file := SpecPath(path); file == "" {
		return nil, false, fmt.Errorf("%w: journal spec %q has no path", ErrJournal, path)
	} else if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		if err := createMemberFile(file, size); err != nil {
			return nil, false, fmt.Errorf("%w: creating %s: %w", ErrJournal, file, err)
		}
		made = true
	}
	m, err = OpenMember(path, false)
	if err != nil {
		return nil, made, fmt.Errorf("%w: opening %s: %w", ErrJournal, path, err)
	}
	return m, made, nil
}

// AssembleOptions configure Assemble. The zero value is a valid default.
type AssembleOptions struct {
	ReadOnly bool         // open members read-only; never write (superblocks included)
	Logger   *slog.Logger // nil: discard
	// RebuildStale turns a stale member (one whose events counter is behind, or whose role
	// the others record as faulty: it missed writes) into a fresh spare, rebuilt from the
	// others. Without it a stale member is left out (closed) and the array assembled without
	// it, if it can be. Either way the log names it and says which.
	RebuildStale bool
	// Force assembles a failed array (two or more roles without a current member) from the
	// members that stopped only when it failed, as mdadm --assemble --force does: a member
	// the others record as faulty is trusted if its own superblock already records another
	// role faulty or being rebuilt, or if it failed together with another role's member (the
	// same events counter and history: the same batch of member writes failed both, and
	// neither superblock records the other's failure), its history agreeing with the freshest
	// superblock (stoppedWithArray): the array had failed when it stopped and no write was
	// acknowledged after. Members that failed together are all trusted, none rebuilt from
	// stripes the failing write may have torn. Never a member whose role another member holds
	// or is being rebuilt into, nor one that failed alone while the array still had every
	// role: it missed the writes acknowledged degraded. The trusted members get one events
	// counter and the array is marked dirty, so the stripes being written at the failure are
	// resynced (with the journal policy: the journal is replayed); stale members become
	// spares and are rebuilt from the trusted ones, as with RebuildStale. The log says which members and
	// events counters it trusts. Without Force such an array is refused with ErrNeedsForce
	// (and ErrTooManyMissing), which says what Force would do. A no-op for an array that
	// can be assembled without it. With ReadOnly nothing is written: the forced array can
	// be looked at before the decision is made permanent.
	Force bool
	// JournalPath overrides where the write journal of an array with the journal policy is
	// ("": the path its superblocks record). Ignored for other policies.
	JournalPath string
	// SkipCorruptJournal assembles an array whose write journal Assemble refuses as corrupt
	// (ErrJournalCorrupt; or holding records in a format this build does not read): none of
	// the journal's records is replayed, they are discarded, and all parity is recomputed
	// from the members' data chunks, which are trusted as they are (a full resync, as
	// without a journal; a crash before it ends resyncs again). Writes flushed before the
	// crash are on the members and kept; degraded, the stripes being written at the crash
	// are the write hole. It changes nothing for a journal that is not corrupt.
	SkipCorruptJournal bool
	// Journal is the write journal, already open (tests); it takes precedence over
	// JournalPath. On success the array owns it; on error the caller does.
	Journal Member
	// WaitRemote bounds how long Assemble waits for remote members (those with no local
	// file: nbd://...) that do not answer yet — nothing listening, a reset, no answer —
	// as after a power cut of a rack, when the member hosts and the daemon's boot in any
	// order: each is tried again, with a backoff from 100 ms to 2 s, until it answers or
	// the bound has passed since Assemble began; then it counts as missing. 0: no wait
	// (one attempt, as before). Local members are never waited for: a file or device
	// that is not there counts as missing at once (a service manager orders the daemon
	// after the devices it needs).
	WaitRemote time.Duration
	// Waiting, if set, is told which remote members Assemble is waiting for (WaitRemote),
	// in the order of paths, whenever that changes: when one first does not answer, and when
	// one answers or is given up (an empty list once none is waited for). It is called from
	// Assemble's goroutine, one call at a time (serve's service-manager STATUS line).
	Waiting   func(away []string)
	IOOptions // stripe cache, stable pages, failure handling (no cache when ReadOnly)
}

// Assemble opens the members at paths, in any order, and puts them in their roles from their
// superblocks. A path that does not exist counts as a missing member (logged), as does a role
// no path names. With one member missing the array is assembled degraded; see the Err*
// variables for what is refused. Assembling a dirty array (not shut down cleanly) logs a warning
// and starts a background resync of the regions its write-intent bitmap marks (all of them
// without a bitmap); assembled degraded, it cannot be resynced: see Status.WriteHole. With the
// journal policy it replays the journal instead, whole or degraded, before it returns; without
// its journal such an array is refused (ErrJournalMissing), or, if it was shut down cleanly,
// assembled read-only.
func Assemble(paths []string, opts AssembleOptions) (*Array, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
		opts.Logger = log
	}
	if err := checkDistinct(paths); err != nil {
		return nil, err
	}
	opened, errs := openMembers(paths, opts.ReadOnly, opts.WaitRemote, opts.Waiting, log)
	var members []Member
	var absent []string
	for i, p := range paths {
		err := errs[i]
		if errors.Is(err, fs.ErrNotExist) {
			log.Warn("raid: member not found; counting it as missing", "member", p, "err", err)
			absent = append(absent, p)
			continue
		}
		if err != nil {
			closeMembers(slices.DeleteFunc(opened, func(m Member) bool { return m == nil }))
			return nil, &MemberError{Member: p, Role: -1, Op: "open", Off: -1, Err: err}
		}
		members = append(members, opened[i])
	}
	a, err := AssembleMembers(members, opts)
	if err != nil {
		closeMembers(members)
		var dd *DirtyDegradedError
		if errors.As(err, &dd) {
			dd.Absent = absent
		}
		if len(absent) > 0 && (errors.Is(err, ErrTooManyMissing) || errors.Is(err, ErrNoMembers)) {
			err = fmt.Errorf("%w (not found: %s)", err, strings.Join(absent, ", "))
		}
		return nil, err
	}
	return a, nil
}

// openMembers opens the members at paths, all at once: ms[i] and errs[i] are what opening
// paths[i] gave. A remote member (no local file: SpecPath "") that does not answer
// (fs.ErrNotExist: nbdmember's ErrUnreachable) is tried again with a backoff until wait has
// passed (AssembleOptions.WaitRemote), each attempt ending by then too
// (member.OpenContext), or until the members that answered leave it nothing to add
// (waitUseless); the log says what it waits for and what came, and so does waiting (if not
// nil: AssembleOptions.Waiting).
func openMembers(paths []string, readOnly bool, wait time.Duration, waiting func([]string), log *slog.Logger) (ms []Member, errs []error) {
	use := useExclusive
	if readOnly {
		use = useShared
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background()) // no wait: one attempt each, as bounded as its kind bounds it
	if wait > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), wait)
	}
	defer cancel()
	type result struct {
		i   int
		m   Member
		err error
	}
	results := make(chan result, len(paths))
	away := make(chan int, len(paths)) // paths[i] did not answer its first attempt (openLate)
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Go(func() {
			if wait > 0 && SpecPath(p) == "" {
				m, err := openLate(ctx, p, use, wait, log, func() { away <- i })
				results <- result{i, m, err}
				return
			}
			m, err := openMemberContext(ctx, p, use)
			results <- result{i, m, err}
		})
	}
	ms, errs = make([]Member, len(paths)), make([]error, len(paths))
	var sbs []*superblock               // of the members opened so far
	awaited := make([]bool, len(paths)) // waited for now
	tell := func() {
		if waiting != nil {
			var ps []string
			for i, w := range awaited {
				if w {
					ps = append(ps, paths[i])
				}
			}
			waiting(ps)
		}
	}
	for pending := len(paths); pending > 0; {
		var r result
		select {
		case i := <-away:
			awaited[i] = true
			tell()
			continue
		case r = <-results:
		}
		pending--
		ms[r.i], errs[r.i] = r.m, r.err
		// Its first failure, if any, was sent before its result: take it first, so that
		// the member waited for and come is told in that order.
		for drained := false; !drained; {
			select {
			case i := <-away:
				awaited[i] = true
				tell()
			default:
				drained = true
			}
		}
		if awaited[r.i] {
			awaited[r.i] = false
			tell()
		}
		if r.err == nil && ctx.Err() == nil {
			if sb, err := readSuperblock(r.m); err == nil {
				sbs = append(sbs, sb)
			}
		}
		if r.err != nil && !errors.Is(r.err, fs.ErrNotExist) {
			cancel() // Assemble fails with it: no use waiting for the others
		}
		if pending > 0 && wait > 0 && ctx.Err() == nil && waitUseless(sbs) {
			log.Info("raid: not waiting for the remote members still away: the members that answered hold every role a late member could take (the others are recorded faulty: a late member of theirs is stale)",
				"waited", time.Since(start).Round(time.Millisecond))
			cancel()
		}
	}
	wg.Wait()
	return ms, errs
}

// openLate opens the remote member at p for use, trying again with a backoff
// (assembleMinBackoff doubling to assembleMaxBackoff) while it does not answer (fs.ErrNotExist:
// nbdmember's ErrUnreachable, a server that refuses, resets, or is silent) until ctx ends,
// wait from now at most; each attempt ends with ctx too (member.OpenContext). The log says
// what it waits for, and what came. An error after more than one attempt says how long it
// tried. away, if not nil, is called once, when the first attempt found no answer.
func openLate(ctx context.Context, p string, use memberUse, wait time.Duration, log *slog.Logger, away func()) (Member, error) {
	start := time.Now()
	backoff := assembleMinBackoff
	for attempt := 1; ; attempt++ {
		m, err := openMemberContext(ctx, p, use)
		if !errors.Is(err, fs.ErrNotExist) || ctx.Err() != nil {
			if attempt > 1 {
				waited := time.Since(start).Round(time.Millisecond)
				if err == nil {
					log.Info("raid: remote member answered", "member", p, "after", waited, "attempts", attempt)
				} else {
					log.Warn("raid: remote member did not answer while it was waited for", "member", p, "waited", waited, "attempts", attempt, "err", err)
					err = fmt.Errorf("%w (no answer in %v, %d attempts)", err, waited, attempt)
				}
			}
			return m, err
		}
		if attempt == 1 {
			log.Warn("raid: remote member does not answer (yet); trying again until it does or the wait has passed",
				"member", p, "wait", wait, "err", err)
			if away != nil {
				away()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, assembleMaxBackoff)
	}
}

// waitUseless reports whether no member that has not answered yet could change the assembly
// of an array whose members that answered have the superblocks sbs: every role either has one
// of them, current, or is recorded faulty in the freshest superblock (a member of it that came
// late would be stale, left out).
func waitUseless(sbs []*superblock) bool {
	if len(sbs) == 0 {
		return false
	}
	ref := referenceSuperblock(sbs)
	held := make([]bool, ref.Members)
	for _, sb := range sbs {
		if sb.ArrayUUID == ref.ArrayUUID && sb.Role >= 0 && sb.Role < ref.Members && !behind(sb, ref) && ref.States[sb.Role] != roleFaulty {
			held[sb.Role] = true
		}
	}
	for r, ok := range held {
		if !ok && ref.States[r] != roleFaulty {
			return false
		}
	}
	return true
}

// The backoff between Assemble's attempts at a remote member that does not answer yet.
const (
	assembleMinBackoff = 100 * time.Millisecond
	assembleMaxBackoff = 2 * time.Second
)

// AssembleMembers is Assemble on members already open, in any order. On success the array owns
// the members; on error the caller still owns them.
func AssembleMembers(members []Member, opts AssembleOptions) (_ *Array, err error) {
	assembled := false // the array owns the journal now
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(members) == 0 {
		return nil, ErrNoMembers
	}
	sbs := make([]*superblock, len(members))
	for i, m := range members {
		sb, err := readSuperblock(m)
		if err != nil {
			return nil, &MemberError{Member: m.Name(), Role: -1, Op: "read superblock", Off: SuperblockOffset, Err: err}
		}
		sbs[i] = sb
	}
	ref := referenceSuperblock(sbs)
	for i, sb := range sbs {
		if sb.ArrayUUID != ref.ArrayUUID {
			return nil, &MemberError{Member: members[i].Name(), Role: sb.Role, Op: "assemble", Off: -1,
				Err: fmt.Errorf("%w: it is in array %s, the other members in %s", ErrForeignMember, sb.ArrayUUID, ref.ArrayUUID)}
		}
	}
	// The journal is found and checked before anything is written.
	var jm Member
	var jh *journal.Header
	jpath := ""
	if ref.Features&featureJournal != 0 {
		var owned bool
		var err error
		jm, jpath, owned, err = openJournal(ref, opts)
		if err != nil {
			if perr := checkJournalPlacement(jpath, memberNames(members)); perr != nil {
				return nil, perr // a member's own file: locked by the member, so busy
			}
			return nil, err
		}
		if jm != nil {
			if err := checkJournalPlacement(jm.Name(), memberNames(members)); err != nil {
				if owned {
					jm.Close()
				}
				return nil, err
			}
		}
		if jm == nil {
			log.Warn("raid: the write journal is missing; the array was shut down cleanly, so nothing needs replaying: assembling it read-only (reassemble with the journal, or JournalPath, to write)",
				"journal", jpath, "array", ref.ArrayUUID)
			opts.ReadOnly = true
		} else if jh, err = journal.ReadHeader(jm, ref.ArrayUUID); err != nil {
			if owned {
				jm.Close()
			}
			return nil, err
		}
		if owned {
			defer func() {
				if jm != nil && !assembled {
					jm.Close()
				}
			}()
		}
	}
	for i, sb := range sbs {
		if err := sameGeometry(sb, ref); err != nil {
			return nil, &MemberError{Member: members[i].Name(), Role: sb.Role, Op: "assemble", Off: -1, Err: err}
		}
	}
	byRole := make([]*member, ref.Members)
	var spares, stale []*member
	for i, sb := range sbs {
		m := newMember(members[i], sb)
		if err := checkConns(m, sb.ArrayUUID, sb.DeviceUUID, sb.Role, "assemble"); err != nil {
			return nil, err
		}
		isStale := behind(sb, ref) && sb.Role >= 0 ||
			sb.Role >= 0 && ref.States[sb.Role] == roleFaulty // recorded as failed by the others
		if sb.Events < ref.Events && !isStale && sb.Role >= 0 {
			log.Info("raid: member one event behind the others, as a superblock update cut short by a crash leaves it; it missed no writes and is accepted",
				"member", members[i].Name(), "role", sb.Role, "events", sb.Events, "array_events", ref.Events)
		}
		switch {
		case isStale:
			stale = append(stale, m)
		case sb.Role == spareRole:
			spares = append(spares, m)
		default:
			if prev := byRole[sb.Role]; prev != nil {
				return nil, &MemberError{Member: members[i].Name(), Role: sb.Role, Op: "assemble", Off: -1,
					Err: fmt.Errorf("%w: %s and %s both claim role %d", ErrDuplicateRole, prev.Name(), members[i].Name(), sb.Role)}
			}
			if ref.States[sb.Role] == roleRebuilding {
				m.rebuilding.Store(true)
			}
			byRole[sb.Role] = m
		}
	}
	missing := missingRoles(byRole)
	var forced []*member
	if len(missing) > 1 {
		plan := forcePlan(ref, byRole, stale)
		rest := slices.DeleteFunc(slices.Clone(stale), func(m *member) bool { return slices.Contains(plan, m) })
		if len(missing)-len(plan) > 1 {
			err := fmt.Errorf("%w: roles %v of array %s have no current member; RAID-5 runs with at most one missing",
				ErrTooManyMissing, missing, ref.ArrayUUID)
			if len(stale) > 0 {
				err = fmt.Errorf("%w; %w: %s (their events counters are behind, or the others record them as faulty: they missed writes)",
					err, ErrStaleMember, describeMembers(stale))
			}
			if len(plan) > 0 {
				err = fmt.Errorf("%w; Force could trust only %s, which stopped only when the array failed: not enough", err, describeMembers(plan))
			}
			return nil, err
		}
		fresh := describeMembers(presentMembers(byRole))
		for _, m := range plan {
			byRole[m.sb.Role] = m
		}
		if !opts.Force {
			return nil, fmt.Errorf("%w: roles %v of array %s have no current member; %w: %s; Force (serve --force) would trust the data of %s with that of %s, give them all one events counter, mark the array dirty, %s and resync the stripes being written at the failure",
				ErrTooManyMissing, missing, ref.ArrayUUID, ErrNeedsForce, forceWhy(plan, stale, ref), describeMembers(plan), fresh, forceRest(missingRoles(byRole), rest))
		}
		log.Warn("raid: FORCED assembly of a failed array: trusting the data of members that stopped only when the array failed, as they were then; the stripes being written at the failure are resynced",
			"array", ref.ArrayUUID, "forced", describeMembers(plan), "trusted", fresh, "why", forceWhy(plan, stale, ref), "array_events", ref.Events,
			"then", forceRest(missingRoles(byRole), rest), "read_only", opts.ReadOnly)
		forced, stale, missing = plan, rest, missingRoles(byRole)
		// The forced members are current from now on, and every stripe being written when
		// the array failed may be torn: the array is dirty (written below with one events
		// counter on every member; read-only: in memory only).
		for _, m := range append(presentMembers(byRole), stale...) {
			m.sb.Dirty = true
		}
	}
	// A stale member missed writes. It is left out, as md kicks a device that is not fresh,
	// or taken as a fresh spare and rebuilt (RebuildStale; Force too: a forced array
	// rebuilds what it cannot trust).
	rebuilt := 0
	var leftOut []*member
	for _, m := range stale {
		if opts.RebuildStale || len(forced) > 0 {
			log.Warn("raid: stale member (missed writes): refusing its data; it becomes a fresh spare and is rebuilt",
				"member", m.Name(), "role", m.sb.Role, "events", m.sb.Events, "array_events", ref.Events)
			m.sb.Role = spareRole
			spares = append(spares, m)
			rebuilt++
			continue
		}
		log.Warn("raid: stale member (missed writes while out of the array) left out; assembling without it (RebuildStale, serve --rebuild-stale, rebuilds it as a spare)",
			"member", m.Name(), "role", m.sb.Role, "events", m.sb.Events, "array_events", ref.Events)
		leftOut = append(leftOut, m)
	}
	for _, m := range append(byRole[:len(byRole):len(byRole)], spares...) {
		if m != nil && m.Size() < ref.DataOffset+ref.DataSize {
			return nil, &MemberError{Member: m.Name(), Role: m.sb.Role, Op: "assemble", Off: -1,
				Err: fmt.Errorf("%w: %d bytes, the array needs %d on each member", ErrMemberTooSmall, m.Size(), ref.DataOffset+ref.DataSize)}
		}
	}
	layout, err := stripe.NewLayout(ref.Members, ref.Chunk, ref.Layout)
	if err != nil {
		return nil, err
	}
	a, err := newArray(layout, byRole, spares, opts.ReadOnly, log, opts.IOOptions)
	if err != nil {
		return nil, err
	}
	a.waitRemote = opts.WaitRemote
	for _, m := range byRole {
		if m != nil && m.rebuilding.Load() {
			a.roles.setRebuilt(ref.Recovery / ref.Chunk)
			if ref.ReAdd != nil {
				// A re-add: the member is whole where its record says, and only the rest
				// of what it missed is resynced.
				m.readd.Store(true)
				a.roles.setReAdd(readdMapOf(ref.ReAdd, ref.DataSize/ref.Chunk), ref.Recovery/ref.Chunk)
			}
			log.Info("raid: resuming the rebuild from its checkpoint", "member", m.Name(), "role", m.sb.Role, "position", ref.Recovery,
				"re-add", m.readd.Load())
		}
	}
	if ref.Features&featureJournal != 0 {
		if jh == nil {
			jh = &journal.Header{}
		}
		a.jr = newJournal(a, jm, jpath, jh)
	}
	dirty := ref.Dirty || len(forced) > 0
	// A re-added member being resynced is not missing where its record says it is whole, and
	// no write went around it anywhere else (Array.awaitReAdd): the stripes a crash tore are
	// all where it is whole, and the resync after its re-add repairs them from the data.
	hole := len(missing) == 1 && (byRole[missing[0]] == nil || !byRole[missing[0]].readd.Load())
	switch {
	case dirty && a.jr != nil && !opts.ReadOnly:
		// Every stripe write since the last checkpoint is in the journal: replaying it
		// completes each one, so parity matches data everywhere, degraded or not.
		a.dirty.Store(true)
		resync, err := a.jr.Recover(opts.SkipCorruptJournal)
		if err != nil {
			return nil, fmt.Errorf("raid: replaying the write journal %s: %w", jpath, err)
		}
		if resync { // the journal was discarded (now or before): parity from the data
			a.unclean = true
			a.resync = a.newResync(0)
			if hole {
				a.noteWriteHole()
			}
		}
	case dirty:
		from := a.resumePoint(ref, true) // the point recorded: nothing written yet
		a.resync = a.newResync(from)
		// A role with no member at all; one being rebuilt onto a spare resumes its rebuild,
		// the hole (above its position) reported as before.
		if hole && byRole[missing[0]] == nil && a.resync.count() > 0 && !opts.Force && !opts.ReadOnly {
			stripes := ref.DataSize / ref.Chunk
			return nil, &DirtyDegradedError{Array: ref.ArrayUUID, Role: missing[0], FailedBefore: ref.States[missing[0]] == roleFaulty,
				Regions: a.resync.ranges(stripes, layout.StripeSize()), Pending: a.resync.count(), Total: len(a.resync.pending)}
		}
		if !opts.ReadOnly {
			if f := a.resumePoint(ref, false); f != from { // it could not clear the point
				a.resync = a.newResync(f)
			}
		}
		a.unclean = true
		a.dirty.Store(true)
		log.Warn("raid: array was not shut down cleanly; parity may be inconsistent until the resync ends",
			"array", ref.ArrayUUID, "regions", a.resync.count(), "of", len(a.resync.pending), "full", a.resync.full,
			"resume_at", a.resync.from*ref.Chunk)
		if hole {
			// Read-only too: reads of the missing member's chunks use that parity.
			a.noteWriteHole()
		}
	}
	if a.bm != nil {
		a.bm.Hold(a.resync.isPending)
		if a.roles.degraded() {
			// The regions written while a role was missing stay set until the array is
			// whole again: they are what a member that comes back missed (ReAdd).
			bits, err := a.bm.Load()
			if err != nil {
				log.Warn("raid: write-intent bitmap unreadable; keeping every region for a re-add", "err", err)
				bits = nil // every bit: a re-add then resyncs everything
			}
			a.bm.Keep(bits)
		}
	}
	if len(missing) == 1 || rebuilt > 0 || len(forced) > 0 {
		if len(missing) == 1 {
			log.Warn("raid: assembled degraded", "array", ref.ArrayUUID, "missing_role", missing[0], "spares", len(spares))
		}
		if !opts.ReadOnly {
			// Record the change, so that the missing member is recognised as stale if it
			// returns, and stale members turned spares say so.
			a.sbMu.Lock()
			err := a.writeSuperblocks(nil)
			a.sbMu.Unlock()
			if err != nil {
				return nil, err
			}
		}
	}
	assembled = true
	for _, m := range leftOut {
		m.Close() // not the array's: closed, so that it can be added back as a spare
	}
	a.startJournal()
	a.start()
	return a, nil
}

// openJournal opens the journal of the array whose reference superblock is ref: opts.Journal,
// or the file at opts.JournalPath, or at the path the superblocks record. owned says whether
// it was opened here. A journal that does not exist is an ErrJournalMissing error if the array
// is dirty; if it is clean, m is nil and err nil (nothing to replay).
func openJournal(ref *superblock, opts AssembleOptions) (m Member, path string, owned bool, err error) {
	if opts.Journal != nil {
		return opts.Journal, opts.Journal.Name(), false, nil
	}
	path = opts.JournalPath
	if path == "" {
		path = ref.JournalPath
	}
	if path == "" {
		err = errors.New("no journal path is recorded: give one")
	} else {
		m, err = OpenMember(path, opts.ReadOnly)
	}
	switch {
	case err == nil:
		return m, path, true, nil
	case !errors.Is(err, fs.ErrNotExist) && path != "":
		return nil, path, false, fmt.Errorf("%w: %s: %w", ErrJournal, path, err)
	case ref.Dirty:
		return nil, path, false, fmt.Errorf("%w: array %s was not shut down cleanly and its journal %q cannot be opened (%v); it holds the writes to replay: assemble with the journal (JournalPath, serve --journal)",
			ErrJournalMissing, ref.ArrayUUID, path, err)
	}
	return nil, path, false, nil
}

// readSuperblock reads and decodes m's superblock.
func readSuperblock(m Member) (*superblock, error) {
	buf := aligned.Make(SuperblockSize) // aligned for direct I/O
	if m.Size() < SuperblockOffset+SuperblockSize {
		return nil, fmt.Errorf("%w: member of %d bytes is too small to hold one", ErrBadMagic, m.Size())
	}
	if _, err := m.ReadAt(buf, SuperblockOffset); err != nil {
		return nil, err
	}
	return decodeSuperblock(buf)
}

// referenceSuperblock picks the array the members are meant to form: the array UUID most
// superblocks carry (ties: the first seen), and among those the superblock with the highest
// events counter.
func referenceSuperblock(sbs []*superblock) *superblock {
	count := map[UUID]int{}
	var best *superblock
	for _, sb := range sbs {
		count[sb.ArrayUUID]++
	}
	for _, sb := range sbs {
		if best == nil || count[sb.ArrayUUID] > count[best.ArrayUUID] ||
			sb.ArrayUUID == best.ArrayUUID && sb.Events > best.Events {
			best = sb
		}
	}
	return best
}

func sameGeometry(sb, ref *superblock) error {
	if sb.Level != ref.Level || sb.Layout != ref.Layout || sb.Chunk != ref.Chunk || sb.Members != ref.Members ||
		sb.DataOffset != ref.DataOffset || sb.DataSize != ref.DataSize {
		return fmt.Errorf("%w: %d members, %s, chunk %d, data %d+%d; the others: %d members, %s, chunk %d, data %d+%d",
			ErrGeometry, sb.Members, sb.Layout, sb.Chunk, sb.DataOffset, sb.DataSize,
			ref.Members, ref.Layout, ref.Chunk, ref.DataOffset, ref.DataSize)
	}
	return nil
}

// checkDistinct refuses a path list that names one file twice.
func checkDistinct(paths []string) error {
	infos := make([]fs.FileInfo, len(paths))
	for i, p := range paths {
		infos[i], _ = os.Stat(SpecPath(p)) // a spec (volatile:PATH) is its file
		for j := range i {
			if paths[j] == p || infos[i] != nil && infos[j] != nil && os.SameFile(infos[i], infos[j]) {
				return &MemberError{Member: p, Role: -1, Op: "open", Off: -1, Err: fmt.Errorf("%w: %s and %s", ErrDuplicateMember, paths[j], p)}
			}
		}
	}
	return nil
}

// checkJournalPlacement refuses a journal on a member's own storage: the same file as a member
// (same device and inode: a second path or a hard link), the same block device (same device
// number, through another device node), or a file on a filesystem of a member block device, or
// the other way round. One disk would then hold a stripe's data and the record meant to repair
// it, and the journal's writes would overwrite the member's. journal and members are paths or
// member specs (their PATH is what counts); one that cannot be stat'ed (an in-memory member, a
// file not made yet) shares nothing. A journal file on the same filesystem as member files is
// allowed (tests put everything on /dev/shm); JournalSharesFilesystem finds that case.
func checkJournalPlacement(journal string, members []string) error {
	var j unix.Stat_t
	if unix.Stat(SpecPath(journal), &j) != nil {
		return nil
	}
	for _, m := range members {
		var st unix.Stat_t
		if unix.Stat(SpecPath(m), &st) != nil {
			continue
		}
		var why string
		switch {
		case j.Dev == st.Dev && j.Ino == st.Ino:
			why = "is the same file as member"
		case isBlock(&j) && isBlock(&st) && j.Rdev == st.Rdev:
			why = "is the same block device as member"
		case !isBlock(&j) && isBlock(&st) && j.Dev == st.Rdev:
			why = "is a file on a filesystem of member"
		case isBlock(&j) && !isBlock(&st) && st.Dev == j.Rdev:
			why = "is the block device holding the filesystem of member"
		default:
			continue
		}
		return fmt.Errorf("%w: journal %s %s %s; put the journal on another disk", ErrJournalOnMember, journal, why, m)
	}
	return nil
}

func isBlock(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFBLK }

// JournalSharesFilesystem reports whether the journal file (a path or member spec) is on the
// same filesystem as one of the member files, and which: legal (the tests do it), but one
// disk failure then takes the journal and a member, so create warns about it. Paths that
// cannot be stat'ed, and block devices, share nothing here (checkJournalPlacement refuses the
// cases that are errors).
func JournalSharesFilesystem(journal string, members []string) (member string, ok bool) {
	var j unix.Stat_t
	if unix.Stat(SpecPath(journal), &j) != nil || j.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", false
	}
	for _, m := range members {
		var st unix.Stat_t
		if unix.Stat(SpecPath(m), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Dev == j.Dev {
			return m, true
		}
	}
	return "", false
}

// memberNames returns the members' names (their paths).
func memberNames(ms []Member) []string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name()
	}
	return names
}

func closeMembers(ms []Member) {
	for _, m := range ms {
		m.Close()
	}
}

// Report is what Examine finds on a set of members.
type Report struct {
	UUID       UUID          // the array most members belong to
	Layout     stripe.Layout // its geometry
	DataOffset int64         // member offset of the data area
	MemberData int64         // bytes of data area per member
	Size       int64         // array size in bytes
	Created    time.Time
	Updated    time.Time
	Events     uint64 // the highest events counter among the array's members
	State      State
	Dirty      bool
	Members    []ExaminedMember // one per path, in the order given
	Missing    []int            // roles with no usable (present, current) member
	Stale      []string         // paths of members whose events counter is behind
	// Forceable: the array has failed, and these stale members stopped only when it did;
	// AssembleOptions.Force (serve --force) would trust them (the decision Assemble makes).
	Forceable []string
	// Consistency is the crash-consistency policy (ConsistencyBitmap, ConsistencyNone or
	// ConsistencyJournal); JournalPath where the superblocks say the journal is.
	Consistency string
	JournalPath string
	// DirtyDegraded: Assemble would refuse these members (ErrDirtyDegraded, unless Force or
	// ReadOnly): the array was not shut down cleanly, a role has no member, and stripes may
	// have been being written at the crash (write-intent regions set, or no bitmap); no
	// journal. AtRisk is the array bytes whose parity may be torn there.
	DirtyDegraded bool
	AtRisk        []Range
}

// Degraded reports whether exactly one role has no usable member.
func (r *Report) Degraded() bool { return len(r.Missing) == 1 }

// Failed reports whether two or more roles have no usable member.
func (r *Report) Failed() bool { return len(r.Missing) > 1 }

// ExaminedMember is one path of a Report.
type ExaminedMember struct {
	Path   string
	Role   int // -1 if no superblock could be read
	Events uint64
	Dirty  bool
	Device UUID
	Size   int64
	Stale  bool  // events behind the array's: it missed writes
	Err    error // why its superblock could not be used (open error, ErrBadSuperblock, ErrForeignMember, ...)
}

// Examine reads the superblocks at paths and reports what it finds. It never writes. It returns
// an error (ErrNoMembers) only if no path holds a valid superblock; the problems of individual
// paths are in Report.Members.
func Examine(paths []string) (*Report, error) {
	rep, _, err := examine(paths)
	return rep, err
}

// examined is what examine found beyond the Report: the newest superblock of the array (ref),
// and for each role the index in paths of the member that holds it (active, or being
// rebuilt into it), -1 for none.
type examined struct {
	ref    *superblock
	byRole []int
	// dirty is the regions an unclean shutdown may have left being written, as assembly
	// reads them (Array.newResync): nil if ref is clean or the policy is the journal.
	dirty *resyncSet
}

// examine is Examine, returning what it found beyond the Report too (nil on an error).
func examine(paths []string) (*Report, *examined, error) {
	rep := &Report{Members: make([]ExaminedMember, len(paths))}
	var sbs []*superblock
	byPath := make([]*superblock, len(paths))
	bms := make([]bitmap.Bits, len(paths)) // each member's write-intent bitmap
	for i, p := range paths {
		em := &rep.Members[i]
		em.Path, em.Role = p, -1
		m, err := openMember(p, useInspect) // no lock: a running daemon's members too
		if err != nil {
			em.Err = err
			continue
		}
		em.Size = m.Size()
		sb, err := readSuperblock(m)
		if err == nil && sb.Features&featureBitmap != 0 && sb.BitmapRegion > 0 {
			bms[i], _ = readBitmap(m, sb) // unreadable: the others' (dirtyRegions)
		}
		m.Close()
		if err != nil {
			em.Err = err
			continue
		}
		em.Role, em.Events, em.Dirty, em.Device = sb.Role, sb.Events, sb.Dirty, sb.DeviceUUID
		sbs = append(sbs, sb)
		byPath[i] = sb
	}
	if len(sbs) == 0 {
		return rep, nil, fmt.Errorf("%w: no valid raid5d superblock on any of %d paths", ErrNoMembers, len(paths))
	}
	ref := referenceSuperblock(sbs)
	rep.UUID, rep.DataOffset, rep.MemberData = ref.ArrayUUID, ref.DataOffset, ref.DataSize
	rep.Created, rep.Updated, rep.Events, rep.Dirty = ref.Created, ref.Updated, ref.Events, ref.Dirty
	rep.Layout, _ = stripe.NewLayout(ref.Members, ref.Chunk, ref.Layout) // checked by decode
	rep.Size = ref.DataSize / ref.Chunk * rep.Layout.StripeSize()
	switch {
	case ref.Features&featureJournal != 0:
		rep.Consistency, rep.JournalPath = ConsistencyJournal, ref.JournalPath
	case ref.Features&featureBitmap != 0:
		rep.Consistency = ConsistencyBitmap
	default:
		rep.Consistency = ConsistencyNone
	}
	present := make([]bool, ref.Members)
	holders := make([]*member, ref.Members) // for forcePlan: superblocks only
	ex := &examined{ref: ref, byRole: slices.Repeat([]int{-1}, ref.Members)}
	var stale []*member
	pathOf := map[*member]string{}
	for i, sb := range byPath {
		em := &rep.Members[i]
		switch {
		case sb == nil:
		case sb.ArrayUUID != ref.ArrayUUID:
			em.Err = fmt.Errorf("%w: it is in array %s", ErrForeignMember, sb.ArrayUUID)
		case sameGeometry(sb, ref) != nil:
			em.Err = sameGeometry(sb, ref)
		case sb.Role == spareRole:
		case behind(sb, ref) || ref.States[sb.Role] == roleFaulty:
			em.Stale = true
			rep.Stale = append(rep.Stale, em.Path)
			m := &member{sb: sb}
			stale, pathOf[m] = append(stale, m), em.Path
		case ref.States[sb.Role] == roleRebuilding:
			holders[sb.Role] = &member{sb: sb}
			ex.byRole[sb.Role] = i
		default:
			present[sb.Role] = true
			holders[sb.Role] = &member{sb: sb}
			ex.byRole[sb.Role] = i
		}
	}
	for r, ok := range present {
		if !ok {
			rep.Missing = append(rep.Missing, r)
		}
	}
	ex.dirty = dirtyRegions(ref, bms, ex.byRole)
	if ref.Dirty && ref.Features&featureJournal == 0 && len(rep.Missing) == 1 && ex.byRole[rep.Missing[0]] < 0 {
		// Assembly's refusal (ErrDirtyDegraded): a role with no member at all.
		stripes := ref.DataSize / ref.Chunk
		if ranges := ex.dirty.ranges(stripes, rep.Layout.StripeSize()); len(ranges) > 0 {
			rep.DirtyDegraded, rep.AtRisk = true, ranges
		}
	}
	if plan := forcePlan(ref, holders, stale); len(rep.Missing) > 1 && len(rep.Missing)-len(plan) <= 1 {
		for _, m := range plan {
			rep.Forceable = append(rep.Forceable, pathOf[m])
		}
	}
	switch {
	case len(rep.Missing) > 1:
		rep.State = StateFailed
	case len(rep.Missing) == 1:
		rep.State = StateDegraded
	case rep.Dirty:
		rep.State = StateActive
	default:
		rep.State = StateClean
	}
	return rep, ex, nil
}

// behind reports whether the member with superblock sb missed changes to the array whose newest
// superblock is ref. Every superblock update is written to the members one after another, and the
// next starts only when it has finished; so a crash in the middle leaves some members exactly one
// event behind, with nothing else missed: data writes go to every working member whatever its
// superblock says, and a change of membership (a failure, a missing member) is recorded as faulty
// in ref's state table. A member one event behind that ref still counts as working is therefore
// current; anything further behind missed a state change, and with it possibly writes.
func behind(sb, ref *superblock) bool {
	if sb.Events >= ref.Events {
		return false
	}
	torn := sb.Events+1 == ref.Events && sb.Role >= 0 && sb.Role < len(ref.States) && ref.States[sb.Role] != roleFaulty
	return !torn
}

// missingRoles returns the roles with no member in byRole, or only one being rebuilt.
func missingRoles(byRole []*member) []int {
	var missing []int
	for r, m := range byRole {
		if m == nil || m.rebuilding.Load() {
			missing = append(missing, r)
		}
	}
	return missing
}

// presentMembers returns the members of byRole that hold their role (not being rebuilt).
func presentMembers(byRole []*member) []*member {
	var ms []*member
	for _, m := range byRole {
		if m != nil && !m.rebuilding.Load() {
			ms = append(ms, m)
		}
	}
	return ms
}

// forcePlan returns the stale members that AssembleOptions.Force may put back into their
// roles, at most one per role (the one with the highest events counter): for each role that
// the freshest superblock ref records as faulty and no member of byRole holds, a member of
// that role that stoppedWithArray. Members that failed together (the same events counter)
// are all in it, as mdadm --assemble --force takes every device of the newest events counter.
func forcePlan(ref *superblock, byRole []*member, stale []*member) []*member {
	var plan []*member
	for r, holder := range byRole {
		if holder != nil || ref.States[r] != roleFaulty {
			continue
		}
		var best *member
		for _, m := range stale {
			if m.sb.Role == r && stoppedWithArray(m, stale, ref) && (best == nil || m.sb.Events > best.sb.Events) {
				best = m
			}
		}
		if best != nil {
			plan = append(plan, best)
		}
	}
	return plan
}

// stoppedWithArray reports whether stale member m stopped only once the array had failed, so
// that its data holds every write the array acknowledged: m.sb is the last superblock update
// it received, and the next one, which it missed, is the one that recorded it faulty (a member
// misses a superblock update only by failing, or by being absent from an assembly, which
// records it faulty the same way). Either m.sb already records another role lost (lostBefore):
// m's failure was then the array's second loss, and from then on every write was refused
// (ErrArrayFailed), so nothing was written without it; or m failed together with another role
// (failedWith finds its members).
func stoppedWithArray(m *member, stale []*member, ref *superblock) bool {
	lost, ok := lostBefore(m.sb, ref)
	return ok && (len(lost) > 0 || len(failedWith(m, stale, ref)) > 0)
}

// failedWith returns the stale members of other roles that failed together with m, in one
// superblock update: ref records their roles faulty, and they stopped at m's events counter
// with the same history (lostBefore agrees with ref). Neither then received the next update,
// which recorded the first of them faulty: when it was written the others were faulty already
// (a member is marked faulty before its failure is recorded, and one whose superblock cannot
// record another's failure fails too), so it left two roles lost and the array failed with it.
// A write that skips a failed member is acknowledged only after the record of its failure, and
// is refused when that record leaves two roles lost; so no write was acknowledged without any
// of them, and each holds every acknowledged write to its own chunks. This is two members
// filling one filesystem in the same batch of member writes (TestForceTwoTogether).
func failedWith(m *member, stale []*member, ref *superblock) []*member {
	var with []*member
	for _, o := range stale {
		if r := o.sb.Role; r >= 0 && r != m.sb.Role && r < len(ref.States) && ref.States[r] == roleFaulty &&
			o.sb.Events == m.sb.Events && o.sb.States == m.sb.States {
			if _, ok := lostBefore(o.sb, ref); ok {
				with = append(with, o)
			}
		}
	}
	return with
}

// lostBefore returns the roles other than its own that the superblock sb of a stale member
// records as lost (faulty, or being rebuilt: losing a member during a rebuild fails the array,
// so the array took no writes after it — roleTable.lost; raid5d before that rule kept writing
// the stripes below the rebuild's position), and whether sb's history agrees with ref's: sb
// records its own role active, every role it records faulty is faulty or being rebuilt in ref,
// and every role it records rebuilding is still rebuilding (or faulty) in ref. (Faulty then
// rebuilding: the update that started the rebuild was under way when this member failed, and
// skipped it, since a member is marked faulty before its failure is recorded; the role was
// lost all along, and a rebuild that has not finished restored nothing.) A role sb records
// lost that ref records active was rebuilt since: writes went on without this member.
func lostBefore(sb, ref *superblock) (lost []int, ok bool) {
	for r := range sb.Members {
		switch {
		case r == sb.Role:
			if sb.States[r] != roleActive {
				return nil, false
			}
		case sb.States[r] == roleRebuilding || sb.States[r] == roleFaulty:
			if ref.States[r] == roleActive {
				return nil, false
			}
			lost = append(lost, r)
		}
	}
	return lost, true
}

// forceWhy says, for a log line or an error, why Force may trust each member of plan (a
// forcePlan of the stale members stale).
func forceWhy(plan, stale []*member, ref *superblock) string {
	var parts []string
	var told []*member
	for _, m := range plan {
		if slices.Contains(told, m) {
			continue
		}
		if lost, _ := lostBefore(m.sb, ref); len(lost) > 0 {
			parts = append(parts, fmt.Sprintf("%s stopped only when the array failed (its own superblock records roles %v already lost, so no write was acknowledged after it stopped)",
				describeMembers([]*member{m}), lost))
			continue
		}
		group := append([]*member{m}, failedWith(m, stale, ref)...)
		told = append(told, group...)
		parts = append(parts, fmt.Sprintf("%s failed together, in one batch of member writes (one events counter, neither superblock records the other's failure): the array failed with them and acknowledged no write without them, so each holds its own chunks of every acknowledged write; all are trusted (as mdadm --force takes every device of the newest events counter), none is rebuilt from stripes the failing write may have torn",
			describeMembers(group)))
	}
	return strings.Join(parts, "; ")
}

// describeMembers lists members for a log line or an error: "PATH (role R, events E), ...".
func describeMembers(ms []*member) string {
	if len(ms) == 0 {
		return "none"
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%s (role %d, events %d)", m.Name(), m.sb.Role, m.sb.Events)
	}
	return strings.Join(parts, ", ")
}

// forceRest says what a forced assembly does about the roles still missing after it: rebuild
// the stale members given (rest) as spares, or run degraded.
func forceRest(missing []int, rest []*member) string {
	switch {
	case len(rest) > 0:
		return "rebuild " + describeMembers(rest) + " from them as a fresh spare"
	case len(missing) > 0:
		return fmt.Sprintf("run degraded without role %v (add a spare to rebuild it)", missing)
	}
	return "run with every role"
}
