package raid_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/raid5d/raid5d/raid"
)

// readMapped reads [off, off+n) with ReadMapped and returns the bytes of its slices joined,
// and whether it answered (else it reads with ReadAt). It releases what it took.
func readMapped(t *testing.T, a *raid.Array, off, n int64) ([]byte, bool) {
	t.Helper()
	p := make([]byte, n)
	v, ok := a.ReadMapped(p, off, nil)
	if !ok {
		if len(v) != 0 {
			t.Fatalf("ReadMapped(%d, %d) refused but returned %d slices", off, n, len(v))
		}
		if k, err := a.ReadAt(p, off); err != nil || int64(k) != n {
			t.Fatalf("ReadAt(%d, %d) = %d, %v", off, n, k, err)
		}
		return p, false
	}
	got := make([]byte, 0, n)
	for _, b := range v {
		got = append(got, b...) // a test may read the slices; the server never does
	}
	a.ReleaseMapped()
	if int64(len(got)) != n {
		t.Fatalf("ReadMapped(%d, %d) returned %d bytes", off, n, len(got))
	}
	return got, true
}

// TestReadMapped: reads through the members' mappings return exactly what ReadAt would — the
// model — with write-back caching and without (StripeCache -1), with writes still dirty in the
// cache, and degraded; small reads are refused.
func TestReadMapped(t *testing.T) {
	for _, cache := range []int{0, -1} {
		t.Run(fmt.Sprintf("StripeCache=%d", cache), func(t *testing.T) { readMappedCase(t, cache) })
	}
}

func readMappedCase(t *testing.T, cache int) {
	const chunk, stripes = 16 << 10, 96
	paths := memberPaths(t.TempDir(), 4)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + stripes*chunk,
		IOOptions: raid.IOOptions{StripeCache: cache, WriteBackDelay: time.Hour, MappedReads: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	size := mustSize(a)
	model := make([]byte, size)
	fill(newRand(7), model)
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}

	rng := newRand(8)
	check := func(phase string, rounds int) (mappedOK int) {
		t.Helper()
		for range rounds {
			n := raid.MappedReadMin + rng.Int64N(6*chunk*3)
			off := rng.Int64N(size - n + 1)
			if rng.IntN(2) == 0 {
				off &^= 4095
			}
			got, ok := readMapped(t, a, off, n)
			if ok {
				mappedOK++
			}
			if i := firstDiff(got, model[off:off+n]); i < len(got) {
				t.Fatalf("%s: read of %d bytes at %d (mapped %v) differs at byte %d", phase, n, off, ok, i)
			}
		}
		return mappedOK
	}

	before := a.Counters().MappedBytesRead
	if k := check("healthy", 100); k == 0 {
		t.Fatalf("healthy: no read of 100 went through the mappings")
	}
	if a.Counters().MappedBytesRead == before {
		t.Fatalf("MappedBytesRead did not move")
	}
	if _, ok := a.ReadMapped(make([]byte, raid.MappedReadMin-1), 0, nil); ok {
		t.Fatalf("ReadMapped took a read below MappedReadMin")
		a.ReleaseMapped()
	}

	// Small writes: with the cache they stay dirty there (an hour's write-back delay), and
	// reads must show them, not the members' older bytes.
	for range 40 {
		p := make([]byte, 4096)
		fill(rng, p)
		off := rng.Int64N(size/4096) * 4096
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	check("dirty", 100)

	// Degraded: member 1's chunks are rebuilt into the buffer, the others still mapped. The
	// writes after the failure leave its file stale, so reading it would be caught.
	if err := a.Fail(paths[1]); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		p := make([]byte, 1+rng.Int64N(4*chunk*3))
		fill(rng, p)
		off := rng.Int64N(size - int64(len(p)) + 1)
		if _, err := a.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	before = a.Counters().MappedBytesRead
	if k := check("degraded", 100); k == 0 || a.Counters().MappedBytesRead == before {
		t.Fatalf("degraded: %d reads went through the mappings", k)
	}
	got, _ := readMapped(t, a, 0, size)
	if i := firstDiff(got, model); i < len(got) {
		t.Fatalf("whole array differs at byte %d", i)
	}
}

// TestReadMappedClose: Close waits for the release of a mapped read (its slices stay mapped
// until then), and ReadMapped refuses once Close has begun.
func TestReadMappedClose(t *testing.T) {
	const chunk = 16 << 10
	paths := memberPaths(t.TempDir(), 3)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: chunk, MemberSize: raid.DataOffset + 32*chunk,
		IOOptions: raid.IOOptions{MappedReads: true}})
	if err != nil {
		t.Fatal(err)
	}
	model := writeModel(t, a, 9)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	v, ok := a.ReadMapped(make([]byte, len(model)), 0, nil)
	if !ok {
		t.Skip("member pages not resident; nothing mapped to hold") // not expected: just written
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	time.Sleep(50 * time.Millisecond) // Close, if it does not wait, is done by now
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a mapped read was not released", err)
	default:
	}
	got := make([]byte, 0, len(model))
	for _, b := range v {
		got = append(got, b...) // still mapped: this would fault if Close had unmapped
	}
	if i := firstDiff(got, model); i < len(got) {
		t.Fatalf("mapped read differs at byte %d", i)
	}
	a.ReleaseMapped()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, ok := a.ReadMapped(make([]byte, len(model)), 0, nil); ok {
		t.Fatalf("ReadMapped answered after Close")
	}
}
