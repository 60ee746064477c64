package test

import (
	"encoding/json"
	"testing"
)

// nbdinfoExport is the part of `nbdinfo --json` output the tests check.
type nbdinfoExport struct {
	Size               int64  `json:"export-size"`
	BlockSizeMinimum   *int64 `json:"block_size_minimum"`
	BlockSizePreferred *int64 `json:"block_size_preferred"`
	BlockSizeMaximum   *int64 `json:"block_size_maximum"`
	IsReadOnly         bool   `json:"is_read_only"`
	CanFlush           bool   `json:"can_flush"`
	CanFUA             bool   `json:"can_fua"`
	CanTrim            bool   `json:"can_trim"`
	CanZero            bool   `json:"can_zero"`
	CanMultiConn       bool   `json:"can_multi_conn"`
}

// nbdinfo runs nbdinfo --json against uri and returns its single export.
func nbdinfo(t *testing.T, uri string) nbdinfoExport {
	t.Helper()
	out := runTool(t, "nbdinfo", "--json", uri)
	var info struct {
		Protocol string          `json:"protocol"`
		Exports  []nbdinfoExport `json:"exports"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("nbdinfo --json: %v\n%s", err, out)
	}
	if info.Protocol != "newstyle-fixed" {
		t.Errorf("protocol %q, want newstyle-fixed", info.Protocol)
	}
	if len(info.Exports) != 1 {
		t.Fatalf("nbdinfo reports %d exports, want 1\n%s", len(info.Exports), out)
	}
	return info.Exports[0]
}

func TestNBDInfoGeometryAndFlags(t *testing.T) {
	need(t, "nbdinfo")
	a := newArray(t)

	for _, tc := range []struct {
		name     string
		flags    []string
		readOnly bool
	}{
		{name: "read-write"},
		{name: "read-only", flags: []string{"--read-only"}, readOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := a.serve(t, tc.flags...)
			got := nbdinfo(t, s.uri)
			s.stop() // the next case serves the same members

			if got.Size != arraySize {
				t.Errorf("export size %d, want %d (3 data members × (64 MiB − 1 MiB data offset))", got.Size, int64(arraySize))
			}
			checkBlockSize(t, "minimum", got.BlockSizeMinimum, 512)
			// The NBD spec wants a power of two; a 4-member full stripe (192 KiB) is not one,
			// so the server may offer 4096, a power of two up to the full stripe, or the stripe.
			checkBlockSize(t, "preferred", got.BlockSizePreferred, 4096, 8192, 16384, 32768, 65536, 131072, stripeData)
			checkBlockSize(t, "maximum", got.BlockSizeMaximum, 32<<20)
			// Write-side flags mean nothing on a read-only export; nbdkit leaves them off there.
			for _, f := range []struct {
				name      string
				got       bool
				writeOnly bool
			}{
				{"can_flush", got.CanFlush, false},
				{"can_multi_conn", got.CanMultiConn, false},
				{"can_fua", got.CanFUA, true},
				{"can_trim", got.CanTrim, true},
				{"can_zero", got.CanZero, true},
			} {
				if !f.got && !(f.writeOnly && tc.readOnly) {
					t.Errorf("%s is false, want true", f.name)
				}
			}
			if got.IsReadOnly != tc.readOnly {
				t.Errorf("is_read_only %v, want %v", got.IsReadOnly, tc.readOnly)
			}
		})
	}
}

func checkBlockSize(t *testing.T, which string, got *int64, want ...int64) {
	t.Helper()
	if got == nil {
		t.Errorf("no block_size_%s reported; want one of %v", which, want)
		return
	}
	for _, w := range want {
		if *got == w {
			return
		}
	}
	t.Errorf("block_size_%s = %d, want one of %v", which, *got, want)
}
