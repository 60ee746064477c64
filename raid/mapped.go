package raid

import (
	"sync"

	"github.com/raid5d/raid5d/stripe"
)

// Mapped reads (IOOptions.MappedReads): small member reads copy from a read-only mapping of the
// member file instead of calling pread (mapper.CopyMapped, MappedCopyMax), and a large read whose bytes
// sit in the page cache of healthy member files need not be copied into a buffer only to be
// copied again into the socket. ReadMapped hands out slices of the members' files mapped
// read-only into memory, and the NBD server writes its reply straight from them: one copy (page
// cache → socket) instead of two (page cache → buffer → socket), and no pread at all. Profiles
// of 1 MiB reads put the preadv at about half of the server's CPU.
//
// What keeps it correct:
//   - Only pages the kernel reports resident (mincore) are handed out, so the send does not
//     read the disk: a member's read error is met by pread on the ordinary path, where the
//     array fails the member and rebuilds the chunk from parity, not in the middle of a reply
//     that can no longer be taken back. (A page evicted and unreadable between the check and
//     the send fails the reply write with EFAULT and closes the connection; the client sees a
//     broken connection, never wrong data.)
//   - The choice of source is ReadAt's: stripes with a cache head (which may hold writes not
//     yet on the members), missing or rebuilding members, members that are not plain files
//     or block devices and members opened with O_DIRECT (no mapping: their bytes are not in
//     the page cache) are read into the caller's buffer as ReadAt would read them.
//   - The slices are read after ReadMapped returns, while the reply is written. A write to
//     the same range that arrives meanwhile may show in the reply; that write is concurrent
//     with the read (its client has not seen the reply), for which NBD promises nothing.
//     Nothing written before the read was issued can be missing: that is on the members or in
//     the cache when the read chooses its source, exactly as for ReadAt.
//   - A mapping is never unmapped while a reply may still read it: every successful
//     ReadMapped holds mapMu for reading until its ReleaseMapped, and Close takes it for
//     writing before it closes (and unmaps) the members. Replacing a mapping in place
//     (MAP_FIXED, see member.File.Remap) is safe under readers: a send that faults afterwards finds the
//     same file pages in the new mapping.
//   - An unreadable page of a mapping raises SIGBUS in whoever touches it. The array's own
//     copies (CopyMapped) turn it into a recovered panic (SetPanicOnFault) and read with pread
//     instead; ReadMapped's slices are only to be handed to the kernel (the socket write), which
//     returns EFAULT rather than faulting. Callers that would read them in user space (TLS
//     encrypts in Go) must not use ReadMapped.
//   - A member file truncated under the array: its pages past the new end leave the page
//     cache (not resident, so ReadMapped does not hand them out) and fault when touched, but
//     the page the new end falls in stays, reading as zeroes past that end. Neither path takes
//     a range whose last byte reads as zero unless fstat says the file covers it (mapper.InFile): it
//     goes to pread, which stops at the end of the file (ErrShortRead), and the chunk is
//     rebuilt from parity. A truncation that
//     lands while a reply is being sent from the mapping is not seen: pages past the new end
//     fail the send (EFAULT: the connection closes, the client gets no wrong bytes), but the
//     tail of the page the new end falls in goes out as zeroes. The next read of the range
//     meets the short file. Only the send's own duration is exposed, and only with mapped reads.

// MappedCopyMax is the largest member read that copies from the member's mapping instead of
// calling pread (IOOptions.MappedReads). A pread of a few KiB costs more in the system call
// than in the copy; larger reads go to pread, whose readahead serves a cold sequential read
// better than page faults do (the mappings are MADV_RANDOM: a fault reads its page only, so
// that random small reads of cold data read no more from the disk than pread would).
const MappedCopyMax = 64 << 10

// MappedReadMin is the smallest read ReadMapped serves: below it the pread it saves costs about
// what the residency check that replaces it does.
const MappedReadMin = 64 << 10

// mappedState is the scratch space of one ReadMapped, pooled.
type mappedState struct {
	cached []uint64                    // bit i: stripe s0+i has a cache head
	span   [stripe.MaxMembers][2]int64 // by role: the lowest and highest member offset to map
	src    [stripe.MaxMembers][]byte   // by role: the member's mapping if it serves the read, else nil
	mem    [stripe.MaxMembers]*member  // by role: the member src maps
	vec    []byte                      // mincore's answer
}

var mappedStates = sync.Pool{New: func() any { return new(mappedState) }}

// ReadMapped is ReadAt for a caller that only passes the bytes on to the kernel (the NBD server
// writing a reply): it returns v with slices appended that hold, in order, the len(p) bytes at
// off. Bytes in resident pages of healthy member files, in stripes the cache does not hold,
// are slices of the members' read-only mappings; the rest is read into p (at its offset in the
// read) as ReadAt would, and the slices point into p. See the comment at the top of mapped.go
// for why this is safe and what the caller must promise: it must not read the slices in user
// space (only hand them to a system call), and it must call ReleaseMapped once after it has
// done with them — Close waits for that.
//
// ok is false, with v unchanged and nothing to release, when mapped reads are off
// (IOOptions.MappedReads), the read is shorter than MappedReadMin, no member it touches can be
// read through a mapping, the array is closed, or any part of the read fails: the caller then
// uses ReadAt, which reports errors as usual.
func (a *Array) ReadMapped(p []byte, off int64, v [][]byte) (_ [][]byte, ok bool) {
	if !a.mapReads || len(p) < MappedReadMin || a.check(off, int64(len(p))) != nil {
		return v, false
	}
	a.opMu.RLock()
	defer a.opMu.RUnlock()
	if a.closed || !a.mapMu.TryRLock() {
		return v, false // Close has begun
	}
	defer func() {
		if !ok {
			a.mapMu.RUnlock()
		}
	}()

	ep := a.extents.Get().(*[]stripe.Extent)
	exts := a.layout.Extents((*ep)[:0], off, int64(len(p)))
	defer func() { *ep = exts[:0]; a.extents.Put(ep) }()
	st := mappedStates.Get().(*mappedState)
	defer func() {
		st.src, st.mem = [stripe.MaxMembers][]byte{}, [stripe.MaxMembers]*member{}
		mappedStates.Put(st)
	}()

	s0 := exts[0].Stripe
	ns := exts[len(exts)-1].Stripe - s0 + 1
	st.cached = a.cachedStripes(s0, ns, st.cached)
	mapOf := func(e *stripe.Extent) *member {
		if b := e.Stripe - s0; st.cached[b/64]&(1<<(b%64)) != 0 {
			return nil
		}
		return a.roles.usable(e.Member, e.Stripe)
	}

	// Which members can serve their share from their mapping: a plain file or block device,
	// mapped, with every page of the span the read touches resident.
	for r := range st.span {
		st.span[r] = [2]int64{-1, -1}
	}
	for i := range exts {
		e := &exts[i]
		m := mapOf(e)
		if m == nil {
			continue
		}
		st.mem[e.Member] = m // the member at the role when the read began
		sp := &st.span[e.Member]
		if sp[0] < 0 {
			sp[0] = e.MemberOff
		}
		sp[1] = e.MemberOff + e.Len
	}
	some := false
	for r, sp := range st.span[:a.roles.n()] {
		if sp[0] < 0 {
			continue
		}
		fm, isMapper := st.mem[r].Member.(mapper)
		if !isMapper {
			continue
		}
		mp := fm.Mapping()
		lo, hi := a.dataOffset+sp[0], a.dataOffset+sp[1]
		if mp == nil || hi > int64(len(mp)) {
			continue
		}
		var in bool
		if in, st.vec = resident(mp[lo:hi], st.vec); in && fm.InFile(mp, hi) {
			st.src[r] = mp
			some = true
		}
	}
	if !some {
		return v, false
	}

	n0, mapped := len(v), int64(0)
	for i := range exts {
		e := &exts[i]
		// The mapping of the member checked above, if the role's member still serves this
		// stripe (not failed, not replaced meanwhile); else as ReadAt would.
		if mp := st.src[e.Member]; mp != nil && mapOf(e) == st.mem[e.Member] {
			at := a.dataOffset + e.MemberOff
			v = append(v, mp[at:at+e.Len:at+e.Len])
			mapped += e.Len
			continue
		}
		dst := p[e.BufOff : e.BufOff+e.Len]
		if err := a.readPiece(dst, *e); err != nil {
			clear(v[n0:])
			return v[:n0], false
		}
		v = append(v, dst)
	}
	a.clientOps.Add(1)
	a.ctr.memberRead.Add(uint64(mapped))
	a.ctr.mappedRead.Add(uint64(mapped))
	for r, sp := range st.span[:a.roles.n()] {
		if st.src[r] != nil {
			a.touchMapped(st.mem[r], a.dataOffset+sp[0], sp[1]-sp[0])
		}
	}
	return v, true
}

// ReleaseMapped ends a successful ReadMapped: its slices are no longer read.
func (a *Array) ReleaseMapped() { a.mapMu.RUnlock() }

// touchMapped tells m's mapping that the n bytes at off of it were used (Touch), which
// replaces the mapping when its page tables call for it, and logs a replacement that failed.
func (a *Array) touchMapped(m *member, off, n int64) {
	if fm, ok := m.Member.(mapper); ok {
		if err := fm.Touch(off, n); err != nil {
			a.log.Warn("raid: replacing a member's mapping failed", "member", m.Name(), "err", err)
		}
	}
}

// closeMapped waits for every mapped read's ReleaseMapped; from then on ReadMapped refuses.
// Close calls it before closing the members (which unmaps them).
func (a *Array) closeMapped() { a.mapMu.Lock() }
