package raid

import (
	"errors"
	"fmt"

	"github.com/raid5d/raid5d/raid/internal/bitmap"
	memberpkg "github.com/raid5d/raid5d/raid/member"
)

// Write-intent bitmap defaults and limits (doc.go # Layout, # Crash consistency).
const (
	// DefaultBitmapBits is the most bits the default region size gives: the region is the
	// smallest power-of-two number of stripes for which the array needs at most this many
	// and that covers at least DefaultBitmapMinRegion.
	DefaultBitmapBits = bitmap.DefaultBits
	// DefaultBitmapMinRegion is the fewest array bytes a default region covers (4 MiB): a
	// write to a region whose bit is clear waits for a bitmap write, so smaller regions made a
	// sequential writer wait every few stripes.
	DefaultBitmapMinRegion = bitmap.DefaultMinRegion
	// BitmapOffset is the member offset of the bitmap, the start of the reserved area.
	BitmapOffset = ReservedOffset
	// MaxBitmapBytes is the room the reserved area has for it.
	MaxBitmapBytes = DataOffset - ReservedOffset
	// BitmapClearDelay is how long a region must have seen no write before its bit is
	// cleared (after the members are synced): a region written again soon after would need
	// its bit set, and synced, again.
	BitmapClearDelay = bitmap.ClearDelay
)

// BitmapStatus describes the write-intent bitmap (Status.Bitmap).
type BitmapStatus struct {
	RegionBytes int64  // array bytes per bit (a power-of-two number of stripes)
	Regions     int    // bits
	Set         int    // bits set in memory now (regions being written, or recently, or waiting for the resync)
	Flushes     uint64 // bitmap writes (each: the changed pages to every member, made durable)
	Waits       uint64 // stripe writes that waited for a bitmap write
}

// bitmapRegionStripes returns the stripes per region (bitmap.RegionStripes).
func bitmapRegionStripes(stripes, stripeSize, regionBytes int64) int64 {
	return bitmap.RegionStripes(stripes, stripeSize, regionBytes)
}

// bitmapBytes is the on-disk size of a bitmap of n bits (bitmap.Bytes).
func bitmapBytes(n int64) int64 { return bitmap.Bytes(n) }

// newBitmap returns the write-intent bitmap of a, regionStripes stripes per bit, every bit
// clear in memory.
func newBitmap(a *Array, regionStripes int64) *bitmap.Bitmap {
	return bitmap.New(bitmapMembers{a}, a.memberData/a.layout.ChunkSize(), regionStripes, a.log)
}

func (a *Array) bitmapStatus() BitmapStatus {
	st := a.bm.Status()
	return BitmapStatus{RegionBytes: st.RegionStripes * a.layout.StripeSize(), Regions: st.Regions, Set: st.Set,
		Flushes: st.Flushes, Waits: st.Waits}
}

// bitmapMembers is the array as the bitmap sees it (bitmap.Members): the working members of
// the roles, the bitmap at BitmapOffset on each.
type bitmapMembers struct{ a *Array }

// WritePages writes pages to every working member of a role, durably (RWF_DSYNC where the
// member supports it, else writes and one Sync). A member that fails is marked faulty; the
// error is returned only if that leaves the array failed.
func (bm bitmapMembers) WritePages(pages []bitmap.Page) error {
	a := bm.a
	var ms []*member
	var roles []int
	for r := range a.roles.n() {
		if m := a.roles.working(r); m != nil {
			ms, roles = append(ms, m), append(roles, r)
		}
	}
	// Concurrently, each bounded by the member timeout (eachMember): Begin holds the
	// bitmap's flush lock meanwhile, so one member that hangs must not hold every write's
	// bitmap update with it. The pages are this flush's own, so a write that outlives the
	// wait reads nothing reused.
	res := a.eachMember(ms, func(i int, m *member) error {
		r := roles[i]
		for k, p := range pages {
			off := BitmapOffset + p.Off
			if !a.roles.enter(r) { // the array has failed: its survivors stay as they were
				return errGateShut
			}
			err := writeDurable(m, p.Data, off, k == len(pages)-1)
			a.roles.leave(r)
			if err != nil {
				return memberErr(m, r, "write bitmap", off, err)
			}
		}
		return nil
	})
	errs := make([]error, len(ms))
	for i, err := range res {
		switch {
		case err == nil:
		case err == errGateShut:
			errs[i] = err
		default:
			if errors.Is(err, ErrMemberHung) {
				err = memberErr(ms[i], roles[i], "write bitmap", BitmapOffset, err)
			}
			ms[i].writeErrs.Add(1)
			a.fail(ms[i], err)
			if a.roles.failed() {
				errs[i] = err
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: writing the write-intent bitmap: %w", ErrArrayFailed, err)
	}
	return nil
}

// Whole reports whether every role has an active member and the last superblock update
// recorded it (Array.wholeRecorded: the cleared mark the superblocks carry is current).
func (bm bitmapMembers) Whole() bool {
	return !bm.a.roles.degraded() && bm.a.wholeRecorded.Load()
}

// Sync syncs the working members (syncMembers).
func (bm bitmapMembers) Sync() error { return bm.a.syncMembers() }

// ReadEach reads the bitmap of every working member of a role into p.
func (bm bitmapMembers) ReadEach(p []byte, each func()) error {
	a := bm.a
	for r := range a.roles.n() {
		m := a.roles.working(r)
		if m == nil {
			continue
		}
		if _, err := m.ReadAt(p, BitmapOffset); err != nil {
			return memberErr(m, r, "read bitmap", BitmapOffset, err)
		}
		each()
	}
	return nil
}

// writeDurable writes p at off of m durably: with RWF_DSYNC if m can, else WriteAt, and Sync
// if last (the caller writes several pages and syncs once).
func writeDurable(m *member, p []byte, off int64, last bool) error {
	if w, ok := m.Member.(memberpkg.DSyncWriter); ok {
		_, err := w.WriteAtDSync(p, off)
		return err
	}
	if _, err := m.WriteAt(p, off); err != nil {
		return err
	}
	if last {
		return m.Sync()
	}
	return nil
}
