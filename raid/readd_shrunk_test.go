package raid_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// TestReAddShrunk: a member failed because its file was cut short (the FLUSH's sync found it
// smaller) is not re-added after its size is put back, as a re-add trusts its data outside the
// regions written while it was away and the bytes past the cut are gone (zeroes now): the
// re-add is refused (ErrCannotReAdd), and every byte still reads back. Without the refusal
// the re-add resynced nothing (no region was written since) and reads returned the zeroes.
func TestReAddShrunk(t *testing.T) {
	const stripes = 64
	dir := t.TempDir()
	var ms []string
	for i := range 4 {
		ms = append(ms, filepath.Join(dir, fmt.Sprint("m", i)))
	}
	a, err := raid.Create(ms, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + stripes*testChunk,
		BitmapRegion: 4 * 3 * testChunk, IOOptions: raid.IOOptions{StripeCache: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	raid.StopBitmapCleaner(a)
	model := make([]byte, stripes*a.Layout().StripeSize())
	for i := range model {
		model[i] = byte(i*7 + i/4096)
	}
	if _, err := a.WriteAt(model, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if !raid.CleanBitmap(a, 0) || a.Status().Bitmap.Set != 0 { // nothing written since: no bit set
		t.Fatalf("bitmap after a clean: %+v, want no bit set", a.Status().Bitmap)
	}
	size := int64(raid.DataOffset + stripes*testChunk)
	if err := os.Truncate(ms[2], raid.DataOffset+stripes/2*testChunk); err != nil {
		t.Fatal(err)
	}
	a.Flush() // its sync finds the member smaller: failed
	if s, _ := memberState(a.Status(), ms[2]); s != raid.MemberFaulty {
		t.Fatalf("member 2 cut short and a FLUSH: %s, want faulty", s)
	}
	if err := os.Truncate(ms[2], size); err != nil { // the size put back: zeroes past the cut
		t.Fatal(err)
	}
	err = a.ReAdd(ms[2])
	if err == nil {
		waitStatus(t, a, "the re-add ended", func(st raid.Status) bool { return st.Sync == nil })
	}
	got := make([]byte, len(model))
	if _, rerr := a.ReadAt(got, 0); rerr != nil {
		t.Fatal(rerr)
	}
	if i := firstDiff(got, model); i < len(model) {
		t.Fatalf("re-add of the member cut short: %v; array byte %d reads %#x, was written %#x (%d bytes differ)", err, i, got[i], model[i], countDiff(got, model))
	}
	if !errors.Is(err, raid.ErrCannotReAdd) {
		t.Fatalf("re-add of the member cut short: %v, want ErrCannotReAdd", err)
	}
	// What the refusal says to do: remove it and add it back, a full rebuild.
	if err := a.Remove(ms[2]); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSpare(ms[2]); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, a, "the rebuild onto it ended", func(st raid.Status) bool {
		s, _ := memberState(st, ms[2])
		return st.Sync == nil && s == raid.MemberActive
	})
	compareArray(t, a, model)
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}
