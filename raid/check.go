package raid

import (
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/raid5d/raid5d/internal/aligned"
	"github.com/raid5d/raid5d/raid/internal/bitmap"
	"github.com/raid5d/raid5d/raid/internal/journal"
)

// ParityCheck is what CheckParity found on the members of a stopped array.
type ParityCheck struct {
	Report  *Report // what Examine finds on the same paths
	Stripes int64   // stripes in the array
	// Checked is the stripes whose parity was compared with their data; of those, Dirty lie
	// where an unclean shutdown may have left a write under way (the write-intent bitmap's
	// set regions, the journal's records, or every stripe of a dirty array with neither),
	// which the next assembly's resync or replay makes consistent.
	Checked, Dirty int64
	// DirtyMismatches is the stripes among Dirty whose parity does not match their data:
	// expected after a crash, repaired by the next assembly.
	DirtyMismatches int64
	// Mismatches is the stripes outside Dirty whose parity does not match their data: no
	// write was under way there, so an acknowledged write left wrong parity (or a member's
	// data was changed behind the array). First lists the first of them (at most
	// maxFirstMismatches), by stripe.
	Mismatches int64
	First      []int64
	// Unchecked says why Checked is below Stripes ("" when every stripe was checked): a role
	// with no member, a role being rebuilt above its recorded position.
	Unchecked string
}

// maxFirstMismatches is how many mismatched stripes ParityCheck.First lists.
const maxFirstMismatches = 16

// CheckParity reads the members at paths, which no daemon may be writing (a stopped or
// killed array), and compares every stripe's parity with its data, opening nothing for
// writing and writing nothing. It reads the superblocks as Examine does, then which stripes
// an unclean shutdown may have left with a write under way, as assembly would: the union
// of the members' write-intent bitmaps, or the stripes of the journal's records (the journal
// where the superblocks say it is), or every stripe of a dirty array with neither. A
// mismatch anywhere else is an acknowledged write with wrong parity. Stripes where a role
// has no member whose data is whole (missing; being rebuilt, above its recorded position, or
// outside what its re-add record says is resynced) cannot be compared and are skipped.
// It returns an error if no path holds a superblock, or a read fails.
func CheckParity(paths []string) (*ParityCheck, error) {
	rep, ex, err := examine(paths)
	if err != nil {
		return &ParityCheck{Report: rep}, err
	}
	ref := ex.ref
	chunk := ref.Chunk
	stripes := ref.DataSize / chunk
	pc := &ParityCheck{Report: rep, Stripes: stripes}
	// A path that answers but is no member of the array (another array's, another geometry,
	// no superblock) is refused, as assembly refuses it: the caller named the wrong files.
	// One that cannot be opened or read counts as missing, as at assembly.
	for _, em := range rep.Members {
		if errors.Is(em.Err, ErrForeignMember) || errors.Is(em.Err, ErrGeometry) || errors.Is(em.Err, ErrBadSuperblock) {
			return pc, &MemberError{Member: em.Path, Role: em.Role, Op: "check parity", Off: -1, Err: em.Err}
		}
	}
	for r, i := range ex.byRole {
		if i >= 0 {
			continue
		}
		why := "has no member"
		for _, em := range rep.Members {
			switch {
			case em.Stale && em.Role == r:
				why = fmt.Sprintf("has no current member (%s is stale: events %d, the array's %d; it missed writes)", em.Path, em.Events, ref.Events)
			case em.Err != nil && why == "has no member":
				why = fmt.Sprintf("has no member (%s could not be read: %v)", em.Path, em.Err)
			}
		}
		pc.Unchecked = fmt.Sprintf("role %d %s: parity cannot be compared without every member", r, why)
		return pc, nil
	}
	ms := make([]Member, len(ex.byRole))
	defer func() {
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
	}()
	for r, i := range ex.byRole {
		// Shared: refused while a daemon holds it.
		if ms[r], err = openMember(paths[i], useShared); err != nil {
			return pc, err
		}
	}
	// Where a role being rebuilt holds whole data: below the recorded position, and for a
	// re-add wherever its record says (readdMap.serves).
	whole := func(int64) bool { return true }
	for r := range ex.byRole {
		if ref.States[r] != roleRebuilding {
			continue
		}
		pos := ref.Recovery / chunk
		var rm *readdMap
		if ref.ReAdd != nil {
			rm = readdMapOf(ref.ReAdd, stripes)
			pc.Unchecked = fmt.Sprintf("role %d is being re-added: stripes above its position %d that its record does not list as resynced are skipped", r, ref.Recovery)
		} else {
			pc.Unchecked = fmt.Sprintf("role %d is being rebuilt: stripes above its recorded position %d are skipped", r, ref.Recovery)
		}
		whole = func(s int64) bool { return s < pos || rm != nil && rm.serves(s) }
	}
	dirty, err := dirtyStripes(ref, ex, stripes)
	if err != nil {
		return pc, err
	}
	// A batch of stripes at a time, a read per member.
	batch := max(1, (1<<20)/chunk)
	bufs := make([][]byte, len(ms))
	for r := range bufs {
		bufs[r] = aligned.Make(int(batch * chunk)) // aligned for direct I/O
	}
	acc := make([]byte, batch*chunk)
	for s0 := int64(0); s0 < stripes; s0 += batch {
		n := min(batch, stripes-s0)
		clear(acc[:n*chunk])
		for r, m := range ms {
			p := bufs[r][:n*chunk]
			off := ref.DataOffset + s0*chunk
			if _, err := m.ReadAt(p, off); err != nil {
				return pc, &MemberError{Member: m.Name(), Role: r, Op: "check parity", Off: off, Err: err}
			}
			subtle.XORBytes(acc[:n*chunk], acc[:n*chunk], p)
		}
		for k := range n {
			s := s0 + k
			if !whole(s) {
				continue
			}
			pc.Checked++
			ok := allZero(acc[k*chunk : (k+1)*chunk])
			switch {
			case dirty(s):
				pc.Dirty++
				if !ok {
					pc.DirtyMismatches++
				}
			case !ok:
				pc.Mismatches++
				if len(pc.First) < maxFirstMismatches {
					pc.First = append(pc.First, s)
				}
			}
		}
	}
	return pc, nil
}

// dirtyStripes returns the test for the stripes that an unclean shutdown of the array whose
// newest superblock is ref may have left with a write under way: ex.dirty (the write-intent
// bitmap, or every stripe with no bitmap), or the stripes of the journal's records, read
// where the superblocks say the journal is. None if the array was shut down cleanly.
func dirtyStripes(ref *superblock, ex *examined, stripes int64) (func(s int64) bool, error) {
	all := func(int64) bool { return true }
	switch {
	case !ref.Dirty:
		return func(int64) bool { return false }, nil
	case ref.Features&featureJournal == 0:
		rs := ex.dirty
		return func(s int64) bool { return s >= rs.from && rs.pending[s/rs.regionStripes].Load() }, nil
	case ref.JournalPath == "":
		return all, nil
	}
	jm, err := openMember(ref.JournalPath, useInspect)
	if err != nil {
		return nil, fmt.Errorf("raid: the write journal of a dirty array: %w", err)
	}
	defer jm.Close()
	h, err := journal.ReadHeader(jm, journal.UUID(ref.ArrayUUID))
	if err != nil {
		return nil, err
	}
	logged := make([]bool, stripes)
	everything, err := journal.Logged(jm, h, func(s0, n int64) {
		for s := max(s0, 0); s < min(s0+n, stripes); s++ {
			logged[s] = true
		}
	})
	if err != nil || everything {
		return all, err
	}
	return func(s int64) bool { return logged[s] }, nil
}

// readBitmap reads the write-intent bitmap of m, whose superblock is sb.
func readBitmap(m Member, sb *superblock) (bitmap.Bits, error) {
	regions := (sb.DataSize/sb.Chunk + sb.BitmapRegion - 1) / sb.BitmapRegion
	b := aligned.Make(int(bitmapBytes(regions))) // aligned for direct I/O
	if _, err := m.ReadAt(b, BitmapOffset); err != nil {
		return nil, &MemberError{Member: m.Name(), Role: sb.Role, Op: "read bitmap", Off: BitmapOffset, Err: err}
	}
	return b, nil
}

// dirtyRegions returns the regions an unclean shutdown of the array whose newest superblock
// is ref may have left being written, as assembly finds them (Array.newResync,
// resumePoint): the union of the bitmaps bms of the members holding a role (byRole: their
// indexes), every region if it has a bit set past the last region or no holder has one;
// with no bitmap every stripe but those below a full resync's clean stop. Nil if ref is
// clean or its policy is the journal (its records say).
func dirtyRegions(ref *superblock, bms []bitmap.Bits, byRole []int) *resyncSet {
	stripes := ref.DataSize / ref.Chunk
	switch {
	case !ref.Dirty || ref.Features&featureJournal != 0:
		return nil
	case ref.Features&featureBitmap == 0 || ref.BitmapRegion <= 0:
		return newResyncSet(stripes, max(stripes/64, 1), min(ref.Resync, ref.DataSize)/ref.Chunk, nil)
	}
	bits := make([][]byte, 0, len(byRole))
	for _, i := range byRole {
		if i >= 0 {
			bits = append(bits, bms[i])
		}
	}
	union, err := bitmap.Union((stripes+ref.BitmapRegion-1)/ref.BitmapRegion, bits...)
	if union == nil || err != nil { // no holder's bitmap, or corrupt: everything
		return newResyncSet(stripes, ref.BitmapRegion, 0, nil)
	}
	return newResyncSet(stripes, ref.BitmapRegion, 0, union.Has)
}

// allZero reports whether every byte of p is 0.
func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}
