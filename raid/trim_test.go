package raid_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// TestTrimPunchesHoles: trimming whole stripes of a file-backed array frees the members' space
// (holes) and the range reads back as zeroes; the partial stripes at either end are zeroed
// through the write path; parity stays right everywhere.
func TestTrimPunchesHoles(t *testing.T) {
	const stripes = 64
	paths := memberPaths(t.TempDir(), 4)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + stripes*testChunk})
	if err != nil {
		t.Fatal(err)
	}
	size := mustSize(a)
	model := make([]byte, size)
	fill(newRand(3), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	before := allocated(t, paths[0])
	ss := a.Layout().StripeSize()
	off, n := ss/2+5, 40*ss
	if err := a.Trim(off, n); err != nil {
		t.Fatal(err)
	}
	clear(model[off : off+n])
	compareArray(t, a, model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	checkMembers(t, paths, a.Layout(), model, -1)
	if after := allocated(t, paths[0]); after > before-30*testChunk {
		t.Fatalf("member 0 allocation %d → %d bytes: want at least 30 chunks freed", before, after)
	}
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// BenchmarkArray measures the array over in-memory members, so the figures are the array's own
// cost (splitting, locking, parity) plus a memcpy per member byte.
func BenchmarkArray(b *testing.B) {
	const chunk = 64 << 10
	for _, n := range []int{3, 5} {
		ms := newMems("b", n, raid.DataOffset+64*chunk)
		a, err := raid.CreateMembers(asMembers(ms), raid.CreateOptions{Chunk: chunk})
		if err != nil {
			b.Fatal(err)
		}
		ss := a.Layout().StripeSize()
		cases := []struct {
			name string
			size int64
			op   func(p []byte, off int64) (int, error)
		}{
			{"write-full-stripe", ss, a.WriteAt},
			{"write-4k", 4 << 10, a.WriteAt},
			{"read-full-stripe", ss, a.ReadAt},
			{"read-4k", 4 << 10, a.ReadAt},
		}
		for _, c := range cases {
			b.Run(c.name+"-n"+string(rune('0'+n)), func(b *testing.B) {
				p := make([]byte, c.size)
				fill(newRand(4), p)
				b.SetBytes(c.size)
				b.ReportAllocs()
				stripes := mustSize(a) / ss
				i := int64(0)
				for b.Loop() {
					if _, err := c.op(p, (i%stripes)*ss); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
		a.Close()
	}
}
