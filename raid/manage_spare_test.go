package raid_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

// TestAddSpareSameFile: a spare that is a member's file under another name (a hard link, a
// volatile: spec of it) or the journal's file is refused before anything is written to it —
// a rebuild onto it would overwrite a live member or the journal.
func TestAddSpareSameFile(t *testing.T) {
	dir := t.TempDir()
	paths := memberPaths(dir, 3)
	journal := filepath.Join(dir, "journal")
	a, err := raid.Create(paths, raid.CreateOptions{Chunk: testChunk, MemberSize: raid.DataOffset + 16*testChunk,
		Consistency: raid.ConsistencyJournal, JournalPath: journal, JournalSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	p := make([]byte, 3*testChunk)
	fill(newRand(3), p)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "m0-link.img")
	jlink := filepath.Join(dir, "journal-link")
	if err := os.Link(paths[0], link); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(journal, jlink); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spare, file string
		want        error
	}{
		{paths[0], paths[0], raid.ErrDuplicateMember},
		{link, paths[0], raid.ErrDuplicateMember},
		{"volatile:" + link, paths[0], raid.ErrDuplicateMember},
		{jlink, journal, raid.ErrJournalOnMember},
	} {
		before, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.AddSpare(c.spare); !errors.Is(err, c.want) {
			t.Errorf("AddSpare(%s): %v, want %v", c.spare, err, c.want)
		}
		after, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before, after) {
			t.Errorf("AddSpare(%s) changed %s", c.spare, c.file)
		}
	}
	if st := a.Status(); len(st.Members) != 3 {
		t.Errorf("status lists %d members, want the 3 of the array and no spare", len(st.Members))
	}
}
