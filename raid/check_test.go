package raid_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// TestCheckParity: CheckParity reads the members of a stopped array and finds every stripe
// whose parity does not match its data, apart from the stripes an unclean shutdown may have
// left being written (the write-intent bitmap's set regions; every stripe of a dirty array
// with no bitmap), which it counts separately: a stripe changed outside them is named.
// Members copied mid-write (a crash: dirty superblocks, the written region's bit set), and
// the same members after a clean stop.
func TestCheckParity(t *testing.T) {
	const stripes = 64
	for _, tc := range []struct {
		name        string
		consistency string
	}{{"bitmap", raid.ConsistencyBitmap}, {"none", raid.ConsistencyNone}} {
		t.Run(tc.name, func(t *testing.T) {
			dir, crash := t.TempDir(), t.TempDir()
			var ms, copies []string
			for i := range 3 {
				ms = append(ms, filepath.Join(dir, fmt.Sprint("m", i)))
				copies = append(copies, filepath.Join(crash, fmt.Sprint("m", i)))
			}
			opts := raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + stripes*testChunk,
				Consistency: tc.consistency, IOOptions: raid.IOOptions{StripeCache: -1}}
			if tc.consistency == raid.ConsistencyBitmap {
				opts.BitmapRegion = 8 * 2 * testChunk // 8 stripes a bit: 8 regions
			}
			a, err := raid.Create(ms, opts)
			if err != nil {
				t.Fatal(err)
			}
			stripeSize := a.Layout().StripeSize()
			// Stripes 20 and 21, in region 2.
			if _, err := a.WriteAt(bytes.Repeat([]byte{0xa5}, int(2*stripeSize)), 20*stripeSize); err != nil {
				t.Fatal(err)
			}
			for i, m := range ms {
				b, err := os.ReadFile(m)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(copies[i], b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			check := func(what string, paths []string, mismatches []int64, dirty, dirtyMismatches int64) {
				t.Helper()
				pc, err := raid.CheckParity(paths)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if pc.Stripes != stripes || pc.Checked != stripes || pc.Unchecked != "" || pc.Mismatches != int64(len(mismatches)) ||
					!slices.Equal(pc.First, mismatches) || pc.Dirty != dirty || pc.DirtyMismatches != dirtyMismatches {
					t.Fatalf("%s: %+v; want %d stripes checked, mismatches at %v, %d dirty with %d mismatched", what, *pc, stripes, mismatches, dirty, dirtyMismatches)
				}
			}
			// flip changes one byte of the data chunk of role 0 in stripe s.
			flip := func(path string, s int64) {
				t.Helper()
				f, err := os.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				b := make([]byte, 1)
				off := raid.DataOffset + s*testChunk + 100
				if _, err := f.ReadAt(b, off); err != nil {
					t.Fatal(err)
				}
				b[0] ^= 0xff
				if _, err := f.WriteAt(b, off); err != nil {
					t.Fatal(err)
				}
			}
			check("clean", ms, nil, 0, 0)
			flip(ms[0], 21)
			flip(ms[0], 50)
			check("clean, stripes 21 and 50 changed", ms, []int64{21, 50}, 0, 0)

			// The crash's copies: region 2 (stripes 16-23) is dirty; with no bitmap, all.
			dirty := int64(8)
			if tc.consistency == raid.ConsistencyNone {
				dirty = stripes
			}
			check("crashed", copies, nil, dirty, 0)
			flip(copies[0], 21)
			if tc.consistency == raid.ConsistencyNone {
				flip(copies[0], 50)
				check("crashed, stripes 21 and 50 changed", copies, nil, dirty, 2)
			} else {
				check("crashed, stripe 21 changed", copies, nil, dirty, 1)
				flip(copies[0], 50)
				check("crashed, stripes 21 and 50 changed", copies, []int64{50}, dirty, 1)
			}

			// A role missing: nothing can be compared.
			pc, err := raid.CheckParity(copies[1:])
			if err != nil || pc.Checked != 0 || !strings.Contains(pc.Unchecked, "role 0") {
				t.Fatalf("role 0 missing: %+v, %v", pc, err)
			}
		})
	}
}
