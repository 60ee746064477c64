package raid

import (
	"golang.org/x/sys/unix"

	"github.com/raid5d/raid5d/raid/internal/journal"
	"github.com/raid5d/raid5d/stripe"
)

// Write journal sizes (doc.go # Layout, # Crash consistency).
const (
	// DefaultJournalSize is the size of a journal file Create makes when none is given.
	DefaultJournalSize = journal.DefaultSize
	// MinJournalSize is the smallest journal accepted; a layout with large stripes needs
	// more (JournalMinSize).
	MinJournalSize = journal.MinBytes
	// MaxJournalPath is the longest journal path the superblock records, in bytes.
	MaxJournalPath = 1024
)

// JournalStatus describes the write journal (Status.Journal).
type JournalStatus = journal.Status

// JournalMinSize returns the smallest journal an array of layout l accepts: room for the two
// headers and four of its largest records (a whole stripe written with one descriptor per
// 4 KiB unit), and at least MinJournalSize.
func JournalMinSize(l stripe.Layout) int64 { return journal.MinSize(l) }

// journalOwner reports whether m holds a valid journal header, and whose.
func journalOwner(m Member) (UUID, bool) {
	u, ok := journal.Owner(m)
	return UUID(u), ok
}

// newJournal returns the journal of a on m (nil: missing, Status only), its current header h.
func newJournal(a *Array, m Member, path string, h *journal.Header) *journal.Journal {
	var dev journal.Device
	if m != nil {
		dev = &journalDevice{Member: m}
	}
	return journal.New(journalArray{a}, dev, h, journal.Config{Path: path, Roles: a.roles.n(),
		DataStart: a.dataOffset, DataEnd: a.dataOffset + a.memberData, Log: a.log})
}

// journalDevice is the journal's Member as a journal.Device: its vectored write is writev
// (one pwritev on a file or block device). Only the journal's group leader writes, so iov
// needs no lock.
type journalDevice struct {
	Member
	iov []unix.Iovec
}

func (d *journalDevice) WriteVec(bufs [][]byte, off int64) (int, error) {
	if cap(d.iov) < len(bufs) {
		d.iov = make([]unix.Iovec, 0, len(bufs))
	}
	return writev(d.Member, bufs, off, d.iov)
}

// journalArray is the array as its journal sees it (journal.Array).
type journalArray struct{ a *Array }

// Apply writes a replayed op to the working member of its role, if there is one.
func (ja journalArray) Apply(op journal.Op) error {
	m := ja.a.roles.working(op.Role)
	if m == nil {
		return nil
	}
	var err error
	if op.Buf == nil {
		err = m.Trim(op.Off, op.Trim)
	} else {
		_, err = m.WriteAt(op.Buf, op.Off)
	}
	if err != nil {
		return memberErr(m, op.Role, "replay journal", op.Off, err)
	}
	return nil
}

func (ja journalArray) Sync() error         { return ja.a.syncMembers() }
func (ja journalArray) ResyncPending() bool { return ja.a.resyncPending() }
