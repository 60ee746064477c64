package raid_test

import (
	"os"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// bitmapBits returns the first bytes of the write-intent bitmap of the member file at path.
func bitmapBits(t *testing.T, path string, n int) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b[raid.BitmapOffset : raid.BitmapOffset+n]
}

// TestBitmapKeptWhileDegraded: a region written while a member is failed keeps its bit, on
// the members, through the cleaner, a clean Close and a degraded reassembly (md keeps them
// for --re-add); a region written while the array was whole is cleared as usual.
func TestBitmapKeptWhileDegraded(t *testing.T) {
	dir := t.TempDir()
	paths := memberPaths(dir, 3)
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: memberSize, BitmapRegion: 1,
		IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	raid.StopBitmapCleaner(a)
	ss := a.Layout().StripeSize()
	if _, err := a.WriteAt([]byte("whole"), 1*ss); err != nil { // stripe 1: bit 1
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0)
	if err := a.Fail(paths[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteAt([]byte("degraded"), 3*ss+10); err != nil { // stripe 3: bit 3
		t.Fatal(err)
	}
	raid.CleanBitmap(a, 0)
	for _, p := range paths[:2] {
		if got := bitmapBits(t, p, 1)[0]; got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after the cleaner, degraded; want bit 3 only", p, got)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths[:2] {
		if got := bitmapBits(t, p, 1)[0]; got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after Close, degraded", p, got)
		}
	}
	b, err := raid.Assemble(paths[:2], raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	raid.StopBitmapCleaner(b)
	raid.CleanBitmap(b, 0)
	if st := b.Status(); st.Bitmap == nil || st.Bitmap.Set != 1 {
		t.Fatalf("reassembled degraded: bitmap %+v, want the one bit kept", st.Bitmap)
	}
	for _, p := range paths[:2] {
		if got := bitmapBits(t, p, 1)[0]; got != 1<<3 {
			t.Fatalf("%s: bitmap byte %08b after a degraded reassembly and the cleaner", p, got)
		}
	}
}
