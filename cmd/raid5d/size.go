package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

var errSize = errors.New("invalid size")

// parseSize reads a byte count written for humans: a plain number of bytes, or a number with a
// binary suffix K, M, G, T or P (optionally followed by "iB" or "B"): 64K = 65536, 1G = 2^30.
// Fractions are allowed with a suffix (1.5G) when the result is a whole number of bytes.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("%w %q: empty", errSize, s)
	}
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(u, "IB")
	u = strings.TrimSuffix(u, "B")
	shift := 0
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		case 'P':
			shift = 50
		}
		if shift != 0 {
			u = u[:n-1]
		}
	}
	if u == "" {
		return 0, fmt.Errorf("%w %q: no number", errSize, s)
	}
	if v, err := strconv.ParseInt(u, 10, 64); err == nil {
		if v < 0 {
			return 0, fmt.Errorf("%w %q: negative", errSize, s)
		}
		if shift > 0 && v > math.MaxInt64>>shift {
			return 0, fmt.Errorf("%w %q: too large", errSize, s)
		}
		return v << shift, nil
	}
	f, err := strconv.ParseFloat(u, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w %q: want a number with an optional K, M, G, T or P suffix", errSize, s)
	}
	if f < 0 {
		return 0, fmt.Errorf("%w %q: negative", errSize, s)
	}
	b := f * float64(int64(1)<<shift)
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("%w %q: too large", errSize, s)
	}
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("%w %q: not a whole number of bytes", errSize, s)
	}
	return int64(b), nil
}

// formatSize writes n bytes the way parseSize reads them, exactly when it can (64K, 1G), and
// otherwise with one decimal and the byte count (e.g. "1.5G (1610612736 bytes)").
func formatSize(n int64) string {
	units := []string{"", "K", "M", "G", "T", "P"}
	for i := len(units) - 1; i > 0; i-- { // the largest unit that divides n exactly
		if unit := int64(1) << (10 * i); n >= unit && n%unit == 0 {
			return strconv.FormatInt(n/unit, 10) + units[i]
		}
	}
	for i := len(units) - 1; i > 0; i-- { // else the largest unit below n, approximately
		if unit := int64(1) << (10 * i); n >= unit {
			return fmt.Sprintf("%.1f%s (%d bytes)", float64(n)/float64(unit), units[i], n)
		}
	}
	return strconv.FormatInt(n, 10)
}

// sizeFlag is a flag.Value holding a size parsed by parseSize.
type sizeFlag struct{ n int64 }

func (f *sizeFlag) String() string {
	if f == nil || f.n == 0 {
		return "0"
	}
	return formatSize(f.n)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	f.n = n
	return nil
}
