package stripe

import (
	"errors"
	"fmt"
	"testing"
)

var allAlgorithms = []Algorithm{LeftAsymmetric, RightAsymmetric, LeftSymmetric, RightSymmetric}

func mustLayout(t testing.TB, members int, chunk int64, alg Algorithm) Layout {
	t.Helper()
	l, err := NewLayout(members, chunk, alg)
	if err != nil {
		t.Fatalf("NewLayout(%d, %d, %v): %v", members, chunk, alg, err)
	}
	return l
}

// mdCompute is md's raid5_compute_sector for the four RAID-5 layouts, written out from the
// formulas in testdata/md/README.md independently of layout.go: for array chunk number c of
// an n-member array it returns the stripe, the data index, the member holding the chunk and
// the stripe's parity member.
func mdCompute(alg Algorithm, n int, c int64) (stripe int64, d, member, parity int) {
	dataDisks := int64(n - 1)
	stripe, d = c/dataDisks, int(c%dataDisks)
	member = d
	switch alg {
	case LeftAsymmetric:
		parity = n - 1 - int(stripe%int64(n))
		if member >= parity {
			member++
		}
	case RightAsymmetric:
		parity = int(stripe % int64(n))
		if member >= parity {
			member++
		}
	case LeftSymmetric:
		parity = n - 1 - int(stripe%int64(n))
		member = (parity + 1 + d) % n
	case RightSymmetric:
		parity = int(stripe % int64(n))
		member = (parity + 1 + d) % n
	default:
		panic(alg)
	}
	return stripe, d, member, parity
}

func TestNewLayoutBounds(t *testing.T) {
	for _, tc := range []struct {
		members int
		chunk   int64
		alg     Algorithm
		err     error
	}{
		{3, 4 << 10, LeftSymmetric, nil},
		{32, 4 << 20, RightAsymmetric, nil},
		{4, DefaultChunk, DefaultAlgorithm, nil},
		{5, 128 << 10, LeftAsymmetric, nil},
		{17, 1 << 20, RightSymmetric, nil},
		{-1, 64 << 10, LeftSymmetric, ErrMembers},
		{0, 64 << 10, LeftSymmetric, ErrMembers},
		{2, 64 << 10, LeftSymmetric, ErrMembers},
		{33, 64 << 10, LeftSymmetric, ErrMembers},
		{4, 0, LeftSymmetric, ErrChunk},
		{4, -4096, LeftSymmetric, ErrChunk},
		{4, 512, LeftSymmetric, ErrChunk},
		{4, 2 << 10, LeftSymmetric, ErrChunk},
		{4, 4<<10 + 1, LeftSymmetric, ErrChunk},
		{4, 12 << 10, LeftSymmetric, ErrChunk}, // a multiple of 4 KiB, not a power of two
		{4, 4<<20 - 4096, LeftSymmetric, ErrChunk},
		{4, 8 << 20, LeftSymmetric, ErrChunk},
		{4, 1 << 62, LeftSymmetric, ErrChunk},
		{4, 64 << 10, Algorithm(4), ErrAlgorithm},
		{4, 64 << 10, Algorithm(255), ErrAlgorithm},
	} {
		t.Run(fmt.Sprintf("n=%d/chunk=%d/%v", tc.members, tc.chunk, tc.alg), func(t *testing.T) {
			l, err := NewLayout(tc.members, tc.chunk, tc.alg)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error = %v, want %v", err, tc.err)
			}
			if err != nil {
				if l != (Layout{}) {
					t.Fatalf("a refused NewLayout returned %+v, want the zero Layout", l)
				}
				return
			}
			if l.Members() != tc.members || l.DataMembers() != tc.members-1 ||
				l.ChunkSize() != tc.chunk || l.Algorithm() != tc.alg ||
				l.StripeSize() != tc.chunk*int64(tc.members-1) {
				t.Fatalf("accessors = %d members, %d data, chunk %d, %v, stripe %d",
					l.Members(), l.DataMembers(), l.ChunkSize(), l.Algorithm(), l.StripeSize())
			}
		})
	}
}

func TestAlgorithmValuesAreMds(t *testing.T) {
	// ALGORITHM_* in drivers/md/raid5.h; stored on disk and printed by mdadm.
	for alg, want := range map[Algorithm]uint8{LeftAsymmetric: 0, RightAsymmetric: 1, LeftSymmetric: 2, RightSymmetric: 3} {
		if uint8(alg) != want {
			t.Errorf("%v = %d, want md's %d", alg, uint8(alg), want)
		}
	}
	if DefaultAlgorithm != LeftSymmetric {
		t.Errorf("DefaultAlgorithm = %v, want md's default left-symmetric", DefaultAlgorithm)
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Algorithm
	}{
		{"left-asymmetric", LeftAsymmetric},
		{"right-asymmetric", RightAsymmetric},
		{"left-symmetric", LeftSymmetric},
		{"right-symmetric", RightSymmetric},
		{"la", LeftAsymmetric},
		{"ra", RightAsymmetric},
		{"ls", LeftSymmetric},
		{"rs", RightSymmetric},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAlgorithm(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("ParseAlgorithm(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
	for _, in := range []string{"", "left", "symmetric", "Left-Symmetric", "LS", "left_symmetric",
		" ls", "ls ", "left-symmetric\n", "2", "parity-last", "raid5", "Algorithm(2)"} {
		t.Run(fmt.Sprintf("bad/%q", in), func(t *testing.T) {
			if _, err := ParseAlgorithm(in); !errors.Is(err, ErrAlgorithm) {
				t.Fatalf("ParseAlgorithm(%q) error = %v, want ErrAlgorithm", in, err)
			}
		})
	}
}

func TestAlgorithmString(t *testing.T) {
	for _, alg := range allAlgorithms {
		if !alg.Valid() {
			t.Errorf("%v not Valid", alg)
		}
		if got, err := ParseAlgorithm(alg.String()); err != nil || got != alg {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", alg.String(), got, err, alg)
		}
	}
	for _, alg := range []Algorithm{4, 5, 255} {
		if alg.Valid() {
			t.Errorf("Algorithm(%d) is Valid", uint8(alg))
		}
		if got, want := alg.String(), fmt.Sprintf("Algorithm(%d)", uint8(alg)); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

// testStripes are stripe numbers to check: two full parity rotations, and some far out.
func testStripes(n int) []int64 {
	var ss []int64
	for s := range int64(2*n + 1) {
		ss = append(ss, s)
	}
	for _, base := range []int64{1 << 20, 1<<40 + 3, 1<<50 - 1} {
		for k := range int64(n) {
			ss = append(ss, base+k)
		}
	}
	return ss
}

func TestStripeMembersArePermutation(t *testing.T) {
	for _, alg := range allAlgorithms {
		for n := MinMembers; n <= MaxMembers; n++ {
			l := mustLayout(t, n, 4<<10, alg)
			for _, s := range testStripes(n) {
				seen := make([]int, n)
				p := l.ParityMember(s)
				if p < 0 || p >= n {
					t.Fatalf("%v n=%d stripe %d: parity member %d out of range", alg, n, s, p)
				}
				seen[p]++
				if got := l.DataIndex(s, p); got != -1 {
					t.Fatalf("%v n=%d stripe %d: DataIndex(parity member %d) = %d, want -1", alg, n, s, p, got)
				}
				for d := range l.DataMembers() {
					m := l.DataMember(s, d)
					if m < 0 || m >= n {
						t.Fatalf("%v n=%d stripe %d: DataMember(%d) = %d out of range", alg, n, s, d, m)
					}
					seen[m]++
					if got := l.DataIndex(s, m); got != d {
						t.Fatalf("%v n=%d stripe %d: DataIndex(DataMember(%d) = %d) = %d", alg, n, s, d, m, got)
					}
					if ws, wd, wm, wp := mdCompute(alg, n, s*int64(n-1)+int64(d)); ws != s || wd != d || wm != m || wp != p {
						t.Fatalf("%v n=%d stripe %d data %d: member %d parity %d, md says member %d parity %d", alg, n, s, d, m, p, wm, wp)
					}
				}
				for m, k := range seen {
					if k != 1 {
						t.Fatalf("%v n=%d stripe %d: member %d named %d times (data+parity must be a permutation)", alg, n, s, m, k)
					}
				}
			}
		}
	}
}

// TestParityRotates checks that over any N consecutive stripes each member holds parity once.
func TestParityRotates(t *testing.T) {
	for _, alg := range allAlgorithms {
		for _, n := range []int{3, 4, 5, 8, 32} {
			l := mustLayout(t, n, 4<<10, alg)
			for _, start := range []int64{0, 1, 7, 1 << 33} {
				count := make([]int, n)
				for s := start; s < start+int64(n); s++ {
					count[l.ParityMember(s)]++
				}
				for m, k := range count {
					if k != 1 {
						t.Fatalf("%v n=%d stripes %d..%d: member %d holds parity %d times", alg, n, start, start+int64(n)-1, m, k)
					}
				}
			}
		}
	}
}

func TestMapBoundaries(t *testing.T) {
	for _, alg := range allAlgorithms {
		for _, n := range []int{3, 4, 5, 32} {
			for _, chunk := range []int64{4 << 10, 16 << 10, 4 << 20} {
				l := mustLayout(t, n, chunk, alg)
				ss := l.StripeSize()
				var offs []int64
				for _, base := range []int64{0, chunk, 2 * chunk, ss - chunk, ss, 2 * ss, int64(n) * ss, 1 << 40, 1<<40 + ss*int64(n)} {
					for _, delta := range []int64{-1, 0, 1, chunk - 1} {
						if base+delta >= 0 {
							offs = append(offs, base+delta)
						}
					}
				}
				t.Run(fmt.Sprintf("%v/n=%d/chunk=%d", alg, n, chunk), func(t *testing.T) {
					for _, off := range offs {
						got := l.Map(off)
						s, d, m, p := mdCompute(alg, n, off/chunk)
						want := Location{Stripe: s, Data: d, Member: m, Parity: p, MemberOff: s*chunk + off%chunk}
						if got != want {
							t.Fatalf("Map(%d) = %+v, want %+v", off, got, want)
						}
					}
				})
			}
		}
	}
}

// TestMapWorked pins a few locations worked out by hand for a 4-member, 16 KiB left-symmetric
// array (md's default): chunk k is in stripe k/3 as data index k%3.
func TestMapWorked(t *testing.T) {
	l := mustLayout(t, 4, 16<<10, LeftSymmetric)
	for _, tc := range []struct {
		off  int64
		want Location
	}{
		{0, Location{Stripe: 0, Data: 0, Member: 0, Parity: 3, MemberOff: 0}},
		{16<<10 - 1, Location{Stripe: 0, Data: 0, Member: 0, Parity: 3, MemberOff: 16<<10 - 1}},
		{16 << 10, Location{Stripe: 0, Data: 1, Member: 1, Parity: 3, MemberOff: 0}},
		{48<<10 - 1, Location{Stripe: 0, Data: 2, Member: 2, Parity: 3, MemberOff: 16<<10 - 1}},
		// Stripe 1: parity on member 2, data 0 on member 3, data 1 on 0, data 2 on 1.
		{48 << 10, Location{Stripe: 1, Data: 0, Member: 3, Parity: 2, MemberOff: 16 << 10}},
		{64<<10 + 5, Location{Stripe: 1, Data: 1, Member: 0, Parity: 2, MemberOff: 16<<10 + 5}},
		{80 << 10, Location{Stripe: 1, Data: 2, Member: 1, Parity: 2, MemberOff: 16 << 10}},
		// Stripe 3: parity on member 0; stripe 4 starts the rotation again.
		{9 * 16 << 10, Location{Stripe: 3, Data: 0, Member: 1, Parity: 0, MemberOff: 48 << 10}},
		{12 * 16 << 10, Location{Stripe: 4, Data: 0, Member: 0, Parity: 3, MemberOff: 64 << 10}},
	} {
		if got := l.Map(tc.off); got != tc.want {
			t.Errorf("Map(%d) = %+v, want %+v", tc.off, got, tc.want)
		}
	}
}

func TestExtentsWorked(t *testing.T) {
	const chunk = 16 << 10
	l := mustLayout(t, 4, chunk, LeftSymmetric)
	// From 1 KiB before the end of chunk 2 to 1 KiB into chunk 5: four pieces.
	got := l.Extents(nil, 3*chunk-1024, 2*chunk+2048)
	want := []Extent{
		{Stripe: 0, Data: 2, Member: 2, MemberOff: chunk - 1024, BufOff: 0, Len: 1024},
		{Stripe: 1, Data: 0, Member: 3, MemberOff: chunk, BufOff: 1024, Len: chunk},
		{Stripe: 1, Data: 1, Member: 0, MemberOff: chunk, BufOff: 1024 + chunk, Len: chunk},
		{Stripe: 1, Data: 2, Member: 1, MemberOff: chunk, BufOff: 1024 + 2*chunk, Len: 1024},
	}
	if len(got) != len(want) {
		t.Fatalf("Extents = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("extent %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// An empty request appends nothing, and Extents appends after what dst holds.
	prefix := []Extent{{Len: -7}}
	if got := l.Extents(prefix, 12345, 0); len(got) != 1 || got[0] != prefix[0] {
		t.Errorf("Extents(prefix, 12345, 0) = %+v, want the prefix alone", got)
	}
	if got := l.Extents(prefix, 0, 1); len(got) != 2 || got[0] != prefix[0] || got[1].Len != 1 {
		t.Errorf("Extents(prefix, 0, 1) = %+v, want the prefix then one 1-byte extent", got)
	}
}

func TestExtentsNoAllocs(t *testing.T) {
	l := mustLayout(t, 5, 4<<10, RightSymmetric)
	dst := make([]Extent, 0, 64)
	var out []Extent
	// 40 chunks' worth, unaligned: 41 extents, within dst's capacity.
	a := testing.AllocsPerRun(100, func() { out = l.Extents(dst[:0], 4096*7+100, 4096*40) })
	if a != 0 {
		t.Errorf("Extents into a pre-sized dst allocates %v per call, want 0", a)
	}
	if len(out) != 41 {
		t.Errorf("got %d extents, want 41", len(out))
	}
	if a := testing.AllocsPerRun(100, func() { _ = l.Map(1<<40 + 12345) }); a != 0 {
		t.Errorf("Map allocates %v per call, want 0", a)
	}
}
