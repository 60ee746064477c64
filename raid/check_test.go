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

// TestCheckParityRefusesOthers: CheckParity of paths that are not all current members of one
// array refuses, or says which member it could not use, where it checked the others and found
// nothing wrong: a member of another array (ErrForeignMember), a file with no superblock; a
// member that missed changes (stale) is named as the reason its role is not checked.
func TestCheckParityRefusesOthers(t *testing.T) {
	create := func(dir string) []string {
		var ms []string
		for i := range 3 {
			ms = append(ms, filepath.Join(dir, fmt.Sprint("m", i)))
		}
		a, err := raid.Create(ms, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + 64*testChunk,
			IOOptions: raid.IOOptions{StripeCache: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		return ms
	}
	as, bs := create(t.TempDir()), create(t.TempDir())
	blank := filepath.Join(t.TempDir(), "blank")
	if err := os.WriteFile(blank, make([]byte, raid.DataOffset+64*testChunk), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		paths []string
		bad   string
	}{
		{"foreign", []string{as[0], as[1], bs[2]}, bs[2]},
		{"foreign extra", []string{as[0], as[1], as[2], bs[0]}, bs[0]},
		{"no superblock", []string{as[0], blank, as[1], as[2]}, blank},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := raid.CheckParity(tc.paths)
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Fatalf("CheckParity(%v): %v (%+v); want an error naming %s", tc.paths, err, pc, tc.bad)
			}
		})
	}
	// A member that missed changes: failed while the others went on.
	a, err := raid.Assemble(as, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Fail(as[2]); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	pc, err := raid.CheckParity(as)
	if err != nil || pc.Checked != 0 || !strings.Contains(pc.Unchecked, as[2]) || !strings.Contains(pc.Unchecked, "stale") {
		t.Fatalf("CheckParity of members one of them stale: %v, %+v; want nothing checked and %s named stale", err, pc, as[2])
	}
	// A path that cannot be opened is a missing member, as at assembly: named, not refused.
	gone := filepath.Join(t.TempDir(), "gone")
	pc, err = raid.CheckParity([]string{as[0], as[1], gone})
	if err != nil || pc.Checked != 0 || !strings.Contains(pc.Unchecked, gone) {
		t.Fatalf("CheckParity with a member that does not exist: %v, %+v; want nothing checked and %s named", err, pc, gone)
	}
}
