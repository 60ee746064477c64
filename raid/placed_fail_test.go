package raid_test

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/member"
)

// trapFile is a member file that, once armed, misbehaves as set: writes below the data area
// (its superblock) fail, writes in it fail, reads in it come back with their first byte
// flipped (and are not copied from the mapping, so that they do), and Covers reports the file
// cut. Every other method is the file's, the mapped ones too.
type trapFile struct {
	*member.File
	armed                                    atomic.Bool
	failSuperblock, failData, badData, uncut bool
}

func (f *trapFile) on() bool { return f.armed.Load() }

func (f *trapFile) WriteAt(p []byte, off int64) (int, error) {
	if f.on() && (f.failSuperblock && off < raid.DataOffset || f.failData && off >= raid.DataOffset) {
		return 0, syscall.EIO
	}
	return f.File.WriteAt(p, off)
}

func (f *trapFile) WriteAtDSync(p []byte, off int64) (int, error) {
	if f.on() && (f.failSuperblock && off < raid.DataOffset || f.failData && off >= raid.DataOffset) {
		return 0, syscall.EIO
	}
	return f.File.WriteAtDSync(p, off)
}

func (f *trapFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if f.on() && f.badData && off >= raid.DataOffset && n > 0 {
		p[0] ^= 0xff
	}
	return n, err
}

func (f *trapFile) CopyMapped(p []byte, off int64) bool {
	if f.on() && f.badData {
		return false
	}
	return f.File.CopyMapped(p, off)
}

func (f *trapFile) Covers(end int64) bool {
	if f.on() && f.uncut {
		return false
	}
	return f.File.Covers(end)
}

// TestPlacedRepairFailsArray: a placed write whose parity member is found cut afterwards
// (Covers) rewrites the stripes' parity through the members (scrubSpan's repair); that write
// fails, failing the parity member, and recording it fails another member's superblock
// write, failing the array. The failure's drain of the write gate waits for every writer
// inside it: the placement must not be one of them while it runs its repair, or CommitPlaced
// (and every request after it) waits for ever.
func TestPlacedRepairFailsArray(t *testing.T) {
	const chunk, stripes = 16 << 10, 32
	paths := memberPaths(modeDir(t, ioMode{shm: true}), 4)
	opts := raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + stripes*chunk,
		IOOptions: raid.IOOptions{MappedWrites: true, StablePages: true, WriteBackDelay: time.Hour}}
	a, err := raid.Create(paths, opts)
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, mustSize(a))
	fill(newRand(41), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	traps := make([]*trapFile, 4)
	ms := make([]raid.Member, 4)
	for i, p := range paths {
		f, err := member.OpenFile(p, member.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		traps[i] = &trapFile{File: f}
		ms[i] = traps[i]
	}
	a, err = raid.AssembleMembers(ms, raid.AssembleOptions{IOOptions: opts.IOOptions})
	if err != nil {
		t.Fatal(err)
	}
	stuck := false
	t.Cleanup(func() {
		if !stuck { // else Close would wait for the stuck placement's stripe locks
			a.Close()
		}
	})
	if _, err := a.ReadAt(make([]byte, len(model)), 0); err != nil { // every member page in memory
		t.Fatal(err)
	}
	l := a.Layout()
	const s0 = 3
	pm := l.ParityMember(s0)
	other := (pm + 1) % 4
	traps[pm].failData, traps[pm].badData, traps[pm].uncut = true, true, true
	traps[other].failSuperblock = true

	ss := l.StripeSize()
	p := make([]byte, ss)
	fill(newRand(42), p)
	v, h, ok := a.PlaceWrite(s0*ss, len(p), nil)
	if !ok {
		t.Fatal("PlaceWrite declined")
	}
	n := 0
	for _, b := range v {
		n += copy(b, p[n:])
	}
	traps[pm].armed.Store(true)
	traps[other].armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- a.CommitPlaced(h, n, true) }()
	select {
	case err := <-done:
		if !errors.Is(err, raid.ErrArrayFailed) {
			t.Fatalf("CommitPlaced whose repair failed the array: %v, want ErrArrayFailed", err)
		}
	case <-time.After(60 * time.Second):
		stuck = true
		t.Fatal("CommitPlaced still running 60 s after its repair failed the array: deadlocked on the write gate's drain")
	}
}
