package main

import (
	"errors"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"512", 512},
		{"4K", 4096},
		{"64k", 65536},
		{"64KiB", 65536},
		{"64KB", 65536},
		{"256M", 256 << 20},
		{"1G", 1 << 30},
		{"1.5G", 3 << 29},
		{"2T", 2 << 40},
		{" 8M ", 8 << 20},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseSize(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
	for _, in := range []string{"", "K", "-1", "-1K", "abc", "1.3", "1X", "9000000P", "NaN", "0.1K"} {
		t.Run("bad/"+in, func(t *testing.T) {
			if got, err := parseSize(in); !errors.Is(err, errSize) {
				t.Fatalf("parseSize(%q) = %d, %v; want errSize", in, got, err)
			}
		})
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 511, 4096, 65536, 3 << 20, 1 << 30, 63 << 20 * 3} {
		s := formatSize(n)
		got, err := parseSize(s)
		if err != nil || got != n {
			t.Errorf("formatSize(%d) = %q, which parses to %d, %v", n, s, got, err)
		}
	}
	if s := formatSize(1536 << 20); s != "1536M" {
		t.Errorf("formatSize(1536M) = %q", s)
	}
	if s := formatSize(1<<30 + 1); s != "1.0G (1073741825 bytes)" {
		t.Errorf("formatSize(1G+1) = %q", s)
	}
}
