package stripe

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ (layout grids, write plans) from the code")

// gridMembers are the member counts that have a grid in testdata/.
var gridMembers = []int{3, 4, 5}

func gridPath(alg Algorithm, n int) string {
	return filepath.Join("testdata", fmt.Sprintf("%v-n%d.txt", alg, n))
}

// grid renders 2·n stripes of layout l: one row per stripe, one column per member, each entry
// the array chunk number (Dk) held there or P.
func grid(l Layout) []byte {
	n := l.Members()
	stripes := int64(2 * n)
	width := len(fmt.Sprintf("D%d", stripes*int64(n-1)-1))
	var b bytes.Buffer
	fmt.Fprintf(&b, `# %v, %d members: where each array chunk lives.
#
# One row per stripe, stripe 0 first; one column per member, member 0 (md's raid-device 0)
# first. An entry Dk is array chunk k, the array bytes [k*chunk, (k+1)*chunk); P is the
# stripe's parity chunk. Stripe s is bytes [s*chunk, (s+1)*chunk) of every member's data
# area and holds chunks s*%d .. s*%d+%d, its data chunks 0..%d in that order.
#
# Generated from stripe.Layout by TestGoldenGrids (go test ./stripe -run TestGoldenGrids
# -update rewrites it) and compared byte for byte. The 4-member grids were also checked by
# hand against md's formulas in testdata/md/README.md (handChecked in golden_test.go), and
# the md fixture images prove the mapping on real md arrays.
#
`, l.Algorithm(), n, n-1, n-1, n-2, n-2)
	var hdr []string
	for m := range n {
		hdr = append(hdr, fmt.Sprintf("%-*s", width, fmt.Sprintf("m%d", m)))
	}
	fmt.Fprintf(&b, "# %s\n", strings.TrimRight(strings.Join(hdr, " "), " "))
	for s := range stripes {
		cells := make([]string, n)
		cells[l.ParityMember(s)] = "P"
		for d := range l.DataMembers() {
			cells[l.DataMember(s, d)] = fmt.Sprintf("D%d", s*int64(n-1)+int64(d))
		}
		for i, c := range cells {
			cells[i] = fmt.Sprintf("%-*s", width, c)
		}
		fmt.Fprintf(&b, "  %s\n", strings.TrimRight(strings.Join(cells, " "), " "))
	}
	return b.Bytes()
}

func TestGoldenGrids(t *testing.T) {
	for _, alg := range allAlgorithms {
		for _, n := range gridMembers {
			path := gridPath(alg, n)
			t.Run(filepath.Base(path), func(t *testing.T) {
				got := grid(mustLayout(t, n, DefaultChunk, alg))
				if *update {
					if err := os.WriteFile(path, got, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update to create it)", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("Layout's grid differs from %s:\n--- Layout\n%s\n--- %s\n%s", path, got, path, want)
				}
			})
		}
	}
}

// handChecked are the 4-member grids (8 stripes) worked out by hand from md's formulas in
// testdata/md/README.md, without running any code. With N = 4 there are 3 data chunks per
// stripe, so stripe s holds chunks 3s, 3s+1, 3s+2 as data indexes d = 0, 1, 2:
//
//	left-asymmetric:  P = 3 - s%4, D = d if d < P else d+1.
//	                  s=1: P=2, d0→0, d1→1, d2→3: D3 D4 P D5.
//	right-asymmetric: P = s%4, D = d if d < P else d+1.
//	                  s=1: P=1, d0→0, d1→2, d2→3: D3 P D4 D5.
//	left-symmetric:   P = 3 - s%4, D = (P+1+d)%4.
//	                  s=1: P=2, d0→3, d1→0, d2→1: D4 D5 P D3.
//	                  s=2: P=1, d0→2, d1→3, d2→0: D8 P D6 D7.
//	right-symmetric:  P = s%4, D = (P+1+d)%4.
//	                  s=1: P=1, d0→2, d1→3, d2→0: D5 P D3 D4.
//	                  s=2: P=2, d0→3, d1→0, d2→1: D7 D8 P D6.
//
// Stripes 4..7 repeat 0..3 with 12 added to every chunk number. These are also the pictures
// md's documentation and mdadm's man page draw for the four layouts.
var handChecked = map[Algorithm][]string{
	LeftAsymmetric: {
		"D0 D1 D2 P",
		"D3 D4 P D5",
		"D6 P D7 D8",
		"P D9 D10 D11",
		"D12 D13 D14 P",
		"D15 D16 P D17",
		"D18 P D19 D20",
		"P D21 D22 D23",
	},
	RightAsymmetric: {
		"P D0 D1 D2",
		"D3 P D4 D5",
		"D6 D7 P D8",
		"D9 D10 D11 P",
		"P D12 D13 D14",
		"D15 P D16 D17",
		"D18 D19 P D20",
		"D21 D22 D23 P",
	},
	LeftSymmetric: {
		"D0 D1 D2 P",
		"D4 D5 P D3",
		"D8 P D6 D7",
		"P D9 D10 D11",
		"D12 D13 D14 P",
		"D16 D17 P D15",
		"D20 P D18 D19",
		"P D21 D22 D23",
	},
	RightSymmetric: {
		"P D0 D1 D2",
		"D5 P D3 D4",
		"D7 D8 P D6",
		"D9 D10 D11 P",
		"P D12 D13 D14",
		"D17 P D15 D16",
		"D19 D20 P D18",
		"D21 D22 D23 P",
	},
}

// TestGoldenGridsHandChecked compares the committed 4-member grids, row by row, with the
// hand-worked ones above, so a grid rewritten with -update from a wrong Layout cannot pass.
func TestGoldenGridsHandChecked(t *testing.T) {
	for alg, want := range handChecked {
		path := gridPath(alg, 4)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var rows []string
		for line := range strings.Lines(string(raw)) {
			if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
				rows = append(rows, strings.Join(f, " "))
			}
		}
		if len(rows) != len(want) {
			t.Fatalf("%s has %d rows, hand-checked grid has %d", path, len(rows), len(want))
		}
		for i := range want {
			if rows[i] != want[i] {
				t.Errorf("%s stripe %d: %q, worked by hand: %q", path, i, rows[i], want[i])
			}
		}
	}
}
