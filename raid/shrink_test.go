package raid_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
	"github.com/raid5d/raid5d/raid/raidtest"
)

// shrinkArray creates a 4-member file array of stripes chunks per member, fills it with random
// data and reassembles it with io (so that nothing is cached), returning the array, the member
// paths and the model.
func shrinkArray(t *testing.T, stripes int64, io raid.IOOptions) (*raid.Array, []string, []byte) {
	t.Helper()
	paths := memberPaths(t.TempDir(), 4)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + stripes*testChunk,
		IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	model := writeModel(t, a, 13)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a, err = raid.Assemble(paths, raid.AssembleOptions{IOOptions: io})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, paths, model
}

// TestShrunkMember: a member file truncated under an assembled array is a failing member, never
// a source of zeroes. Every byte read afterwards — by pread, preadv, copies from the mapping
// and ReadMapped's slices, with and without the cache — is the original data, rebuilt from
// parity where the member lost it; the member's short reads are counted as read errors and
// past the limit it is marked faulty. The cut is page aligned or in the middle of a page (whose
// tail then reads as zeroes through a mapping instead of faulting).
func TestShrunkMember(t *testing.T) {
	const stripes = 64
	for _, mode := range cacheModes {
		for _, mapped := range []bool{false, true} {
			for _, cut := range []int64{stripes / 2 * testChunk, 21*testChunk + 1000} {
				t.Run(fmt.Sprintf("%s/mapped=%v/cut=%d", mode.name, mapped, cut), func(t *testing.T) {
					t.Parallel()
					opts := mode.io
					opts.MappedReads = mapped
					opts.ReadErrorLimit = 3
					a, paths, model := shrinkArray(t, stripes, opts)
					if mapped { // map the members and make their pages resident
						for off := int64(0); off < int64(len(model)); off += raid.MappedReadMin {
							readMapped(t, a, off, min(raid.MappedReadMin, int64(len(model))-off))
						}
					}
					if err := os.Truncate(paths[1], raid.DataOffset+cut); err != nil {
						t.Fatal(err)
					}
					if mapped {
						// ReadMapped at every chunk offset, so that some read's share of
						// member 1 ends in the page the cut is in.
						for off := int64(0); off+raid.MappedReadMin <= int64(len(model)); off += testChunk {
							got, _ := readMapped(t, a, off, raid.MappedReadMin)
							if i := firstDiff(got, model[off:off+raid.MappedReadMin]); i < len(got) {
								t.Fatalf("ReadMapped at %d differs from the model at byte %d (%d in the array)", off, i, off+int64(i))
							}
						}
					}
					compareArray(t, a, model)
					m := a.Status().Members[1]
					if m.ReadErrors == 0 || m.State != raid.MemberFaulty {
						t.Fatalf("member 1 after reads of its lost range: state %q, %d read errors; want faulty", m.State, m.ReadErrors)
					}
					compareArray(t, a, model) // degraded now
				})
			}
		}
	}
}

// TestShrunkMemberScrub: a scrub (repair) over a member truncated under the array stops at the
// short read instead of "repairing" parity from zeroes: no other member's file changes.
func TestShrunkMemberScrub(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			opts := mode.io
			opts.ReadErrorLimit = 1000 // the member stays active: the scrub meets its short reads
			opts.SyncSpeedMax = 1 << 30
			a, paths, model := shrinkArray(t, 64, opts)
			before := make([][]byte, len(paths))
			for r, p := range paths {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				before[r] = b
			}
			if err := os.Truncate(paths[1], raid.DataOffset+32*testChunk); err != nil {
				t.Fatal(err)
			}
			if err := a.StartScrub(true); err != nil {
				t.Fatal(err)
			}
			var p *raid.Progress
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
				if st := a.Status(); st.Sync == nil && st.LastScrub != nil {
					p = st.LastScrub
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("scrub did not finish")
				}
			}
			if p.Err == "" {
				t.Errorf("scrub over a truncated member finished without an error: %+v", p)
			}
			for r, path := range paths {
				if r == 1 {
					continue
				}
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				b, was := b[raid.DataOffset:], before[r][raid.DataOffset:] // the superblocks change: events, dirty
				if i := firstDiff(b, was); i < len(b) || len(b) != len(was) {
					t.Fatalf("member %d's data area changed at byte %d by a scrub over a truncated member", r, i)
				}
			}
			compareArray(t, a, model)
		})
	}
}

// shortMember returns less than asked, without an error, for reads at or past cut: a member
// that breaks the ReadAt contract.
type shortMember struct {
	raid.Member
	cut int64
}

func (m *shortMember) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > m.cut {
		n := max(0, m.cut-off)
		k, err := m.Member.ReadAt(p[:n], off)
		return k, err
	}
	return m.Member.ReadAt(p, off)
}

// TestShortReadContract: a member read that returns less than asked — with io.EOF, as a
// truncated file does, or with no error at all — is a read error (ErrShortRead) of that
// member, and its bytes are rebuilt from parity; fileMember's own reads report ErrShortRead
// with errno EIO.
func TestShortReadContract(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			const chunks = 16
			ms := newMems("s", 4, raid.DataOffset+chunks*testChunk)
			a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: testChunk, IOOptions: raid.IOOptions{StripeCache: -1}})
			if err != nil {
				t.Fatal(err)
			}
			model := writeModel(t, a, 3)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			members := make([]raid.Member, len(ms))
			for i, m := range ms {
				m.Reopen()
				members[i] = m
			}
			members[2] = &shortMember{Member: ms[2], cut: raid.DataOffset + chunks/2*testChunk}
			opts := raid.AssembleOptions{IOOptions: mode.io}
			opts.ReadErrorLimit = 1000
			a, err = raid.AssembleMembers(members, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			compareArray(t, a, model)
			if m := a.Status().Members[2]; m.ReadErrors == 0 || m.State != raid.MemberActive {
				t.Fatalf("member 2: state %q, %d read errors; want active with errors counted", m.State, m.ReadErrors)
			}
		})
	}

	t.Run("file", func(t *testing.T) {
		path := t.TempDir() + "/m"
		if err := os.WriteFile(path, bytes.Repeat([]byte{7}, 3*4096), 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := raid.OpenMember(path, true)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := os.Truncate(path, 4096+100); err != nil {
			t.Fatal(err)
		}
		p := make([]byte, 8192)
		n, err := m.ReadAt(p, 0)
		if !errors.Is(err, raid.ErrShortRead) || errors.Is(err, io.EOF) || errnoOf(err) != eio || n != 4096+100 {
			t.Fatalf("ReadAt past the new end = %d, %v (errno %d); want %d, ErrShortRead, EIO", n, err, errnoOf(err), 4096+100)
		}
		if n, err := m.ReadAt(p[:100], 5000); !errors.Is(err, raid.ErrShortRead) || n != 0 {
			t.Fatalf("ReadAt wholly past the new end = %d, %v; want 0, ErrShortRead", n, err)
		}
		if n, err := m.ReadAt(p[:4196], 0); err != nil || n != 4196 {
			t.Fatalf("ReadAt up to the new end = %d, %v", n, err)
		}
	})
}

// TestShrunkMemberRebuild: a rebuild whose source member was truncated under the array stops
// at the short read instead of writing a spare from zeroes; the spare does not become active,
// and every read of the array returns the data written or an error (ErrArrayFailed where the
// lost ranges of two roles meet), never zeroes.
func TestShrunkMemberRebuild(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			const stripes = 64
			opts := mode.io
			opts.ReadErrorLimit = 1000
			opts.SyncSpeedMax = 1 << 30
			a, paths, model := shrinkArray(t, stripes, opts)
			if err := a.AddSpareMember(raidtest.NewMem("spare", raid.DataOffset+stripes*testChunk)); err != nil {
				t.Fatal(err)
			}
			const cut = stripes / 2 * testChunk
			if err := os.Truncate(paths[2], raid.DataOffset+cut); err != nil {
				t.Fatal(err)
			}
			if err := a.Fail(paths[0]); err != nil {
				t.Fatal(err)
			}
			var st raid.Status
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
				if st = a.Status(); st.Sync == nil && st.LastRebuild != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("rebuild did not end")
				}
			}
			if p := st.LastRebuild; p.Err == "" || p.Done >= p.Total {
				t.Errorf("rebuild from a truncated member: %+v; want it stopped with an error", *p)
			}
			for _, m := range st.Members {
				if m.Path == "spare" && m.State == raid.MemberActive {
					t.Errorf("the spare became active after a rebuild from a truncated member")
				}
			}
			ss := a.Layout().StripeSize()
			p := make([]byte, testChunk)
			for off := int64(0); off < int64(len(model)); off += testChunk {
				n, err := a.ReadAt(p, off)
				switch {
				case err == nil && !bytes.Equal(p, model[off:off+testChunk]):
					t.Fatalf("read at %d (stripe %d) returned wrong bytes and no error", off, off/ss)
				case err != nil && !errors.Is(err, raid.ErrArrayFailed):
					t.Fatalf("read at %d: %v; want the data or ErrArrayFailed", off, err)
				case err != nil && off < cut/testChunk*ss:
					t.Fatalf("read at %d, before the cut: %d, %v", off, n, err)
				}
			}
		})
	}
}

// TestShrunkMemberFlush: a member truncated under the array is failed at the next flush
// (ErrMemberShrunk) even when no read has met its new end and no write has grown it (those are
// TestShrunkMember's and TestShrunkMemberGrownBack's): here a stripe below the cut is rewritten,
// which the file takes within its new end. Every byte then reads back from parity.
func TestShrunkMemberFlush(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			const stripes = 64
			a, paths, model := shrinkArray(t, stripes, mode.io)
			if err := os.Truncate(paths[1], raid.DataOffset+stripes/2*testChunk); err != nil {
				t.Fatal(err)
			}
			ss := a.Layout().StripeSize()
			off := 10 * ss // a whole stripe before the cut: no reads
			fill(newRand(99), model[off:off+ss])
			if _, err := a.WriteAt(model[off:off+ss], off); err != nil {
				t.Fatal(err)
			}
			if m := a.Status().Members[1]; mode.io.StripeCache < 0 && m.State != raid.MemberActive {
				t.Fatalf("truncated member after a write within its new end: state %q; want active until the flush", m.State)
			}
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			if m := a.Status().Members[1]; m.State != raid.MemberFaulty {
				t.Fatalf("truncated member after a flush: state %q; want faulty", m.State)
			}
			compareArray(t, a, model)
		})
	}
}

// TestShrunkMemberGrownBack: a member truncated under the array and grown back by the array's
// own writes past its new end is failed by the write that grew it, not trusted until a flush:
// pwrite extends a file without an error, and the hole it leaves reads as zeroes, which
// read-modify-writes would fold into parity and reads return as data. Random 4 KiB writes
// (whose reads meet the hole once other writes have grown the file) or one write of the last
// stripe (which grows the file back to its full size, so that a flush's size check passes):
// every byte then reads back as written, and member 1 is faulty.
func TestShrunkMemberGrownBack(t *testing.T) {
	const stripes = 64
	for _, mode := range cacheModes {
		for _, writes := range []string{"random-4k", "last-stripe"} {
			t.Run(mode.name+"/"+writes, func(t *testing.T) {
				t.Parallel()
				opts := mode.io
				opts.ReadErrorLimit = 1000 // failed by its writes, not by counted read errors
				a, paths, model := shrinkArray(t, stripes, opts)
				if err := os.Truncate(paths[1], raid.DataOffset+stripes/2*testChunk); err != nil {
					t.Fatal(err)
				}
				ss := a.Layout().StripeSize()
				rng := newRand(7)
				switch writes {
				case "random-4k":
					for range 300 {
						off := rng.Int64N(int64(len(model))/4096) * 4096
						fill(rng, model[off:off+4096])
						if _, err := a.WriteAt(model[off:off+4096], off); err != nil {
							t.Fatal(err)
						}
					}
				case "last-stripe":
					off := int64(len(model)) - ss
					fill(rng, model[off:])
					if _, err := a.WriteAt(model[off:], off); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				if m := a.Status().Members[1]; m.State != raid.MemberFaulty {
					t.Errorf("member 1, truncated and grown back by writes: state %q; want faulty", m.State)
				}
				compareArray(t, a, model)
			})
		}
	}
}
