package raid_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// status returns a's extents over [off, off+n) as "length:flags" strings, checking that they
// tile the range exactly and that every hole reads as zeroes in model.
func status(t *testing.T, a *raid.Array, model []byte, off, n int64) string {
	t.Helper()
	ext, err := a.BlockStatus(off, n, make([]raid.Extent, 0, 1<<16))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	pos := off
	for i, e := range ext {
		if e.Length <= 0 {
			t.Fatalf("extent %d: %+v", i, e)
		}
		if i > 0 && ext[i-1].Hole == e.Hole {
			t.Fatalf("extents %d and %d not merged: %+v", i-1, i, ext)
		}
		if e.Hole {
			for j := pos; j < pos+e.Length; j++ {
				if model[j] != 0 {
					t.Fatalf("hole [%d, %d) holds data at %d", pos, pos+e.Length, j)
				}
			}
		}
		flags := 0 // as NBD says it: HOLE|ZERO = 3
		if e.Hole {
			flags = 3
		}
		out = append(out, fmt.Sprintf("%d:%d", e.Length, flags))
		pos += e.Length
	}
	if pos != off+n {
		t.Fatalf("extents cover [%d, %d), want [%d, %d): %v", off, pos, off, off+n, out)
	}
	return strings.Join(out, " ")
}

// TestBlockStatus: a fresh file-backed array is one hole; a write is data as a whole stripe
// while it is dirty in the cache, and exactly its 4 KiB blocks once written out; a trim of
// whole stripes makes them holes again; a degraded array is all data. With and without the
// stripe cache; every hole reported reads as zeroes (status checks it against the model).
func TestBlockStatus(t *testing.T) {
	for _, cache := range []int{0, -1} {
		t.Run(fmt.Sprintf("StripeCache=%d", cache), func(t *testing.T) { blockStatus(t, cache) })
	}
}

func blockStatus(t *testing.T, cache int) {
	const chunk, stripes = 64 << 10, 32
	paths := memberPaths(t.TempDir(), 3)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + stripes*chunk,
		IOOptions: raid.IOOptions{StripeCache: cache, WriteBackDelay: time.Hour}}) // a write stays dirty until Flush
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	size := mustSize(a)
	S := a.Layout().StripeSize() // 128 KiB
	model := make([]byte, size)
	want := func(off, n int64, w string) {
		t.Helper()
		if got := status(t, a, model, off, n); got != w {
			t.Errorf("BlockStatus(%d, %d) = %s, want %s", off, n, got, w)
		}
	}
	want(0, size, fmt.Sprintf("%d:3", size))
	want(4096+512, 1000, "1000:3") // unaligned edges inside a hole stay a hole

	// 4 KiB in stripe 3, data chunk 1: dirty in the cache (a whole-stripe extent), then
	// written out (its block only).
	p := make([]byte, 4096)
	fill(newRand(1), p)
	off := 3*S + chunk + 8192
	if _, err := a.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], p)
	if cache == 0 {
		want(0, size, fmt.Sprintf("%d:3 %d:0 %d:3", 3*S, S, size-4*S))
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	want(0, size, fmt.Sprintf("%d:3 4096:0 %d:3", off, size-off-4096))
	want(off+1024, 8192, "3072:0 5120:3")
	// A whole stripe written at once, with data; then trimmed whole again.
	q := make([]byte, 2*S)
	fill(newRand(2), q)
	if _, err := a.WriteAt(q, 10*S); err != nil {
		t.Fatal(err)
	}
	copy(model[10*S:], q)
	want(9*S, 4*S, fmt.Sprintf("%d:3 %d:0 %d:3", S, 2*S, S))
	if err := a.Trim(10*S, 2*S); err != nil {
		t.Fatal(err)
	}
	clear(model[10*S : 12*S])
	want(9*S, 4*S, fmt.Sprintf("%d:3", 4*S))

	// Room for two extents: a prefix.
	ext, err := a.BlockStatus(0, size, make([]raid.Extent, 0, 2))
	if err != nil || len(ext) != 2 || ext[0] != (raid.Extent{Length: off, Hole: true}) || ext[1] != (raid.Extent{Length: 4096}) {
		t.Errorf("BlockStatus with room for 2: %+v, %v", ext, err)
	}
	if _, err := a.BlockStatus(size-4096, 8192, nil); !errors.Is(err, raid.ErrOutOfRange) {
		t.Errorf("BlockStatus past the end: %v, want ErrOutOfRange", err)
	}

	// Degraded: all data, though it still reads as before.
	if err := a.Fail(paths[1]); err != nil {
		t.Fatal(err)
	}
	want(0, size, fmt.Sprintf("%d:0", size))
	compareArray(t, a, model)
}

// TestBlockStatusRandom: random writes, trims and flushes; after each, every hole reported
// reads as zeroes in the model, and the extents tile the array.
func TestBlockStatusRandom(t *testing.T) {
	const chunk, stripes = 16 << 10, 64
	paths := memberPaths(t.TempDir(), 4)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + stripes*chunk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	size := mustSize(a)
	model := make([]byte, size)
	rng := newRand(9)
	for i := range 60 {
		off := rng.Int64N(size/512) * 512
		n := min(size-off, (1+rng.Int64N(64))*512)
		switch rng.IntN(4) {
		case 0:
			if err := a.Trim(off, n); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
		case 1:
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
		default:
			p := make([]byte, n)
			fill(rng, p)
			if _, err := a.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], p)
		}
		o := rng.Int64N(size/512) * 512
		status(t, a, model, o, min(size-o, 1+rng.Int64N(size)))
		if i%10 == 0 {
			status(t, a, model, 0, size)
		}
	}
	compareArray(t, a, model)
}
