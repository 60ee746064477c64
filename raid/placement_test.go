package raid

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestJournalPlacementDevices: checkJournalPlacement's block-device cases, on device nodes made
// with mknod (root only; nothing opens them): two nodes of one device number are the same
// device; a file whose filesystem is a member device (st_dev = the member's rdev) is on the
// member, and so is the reverse; another device number is not. TestJournalOnMember covers
// the same-file case through Create and Assemble.
func TestJournalPlacementDevices(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "j.img")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var fst unix.Stat_t
	if err := unix.Stat(file, &fst); err != nil {
		t.Fatal(err)
	}
	node := func(name string, dev uint64) string {
		p := filepath.Join(dir, name)
		if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(dev)); err != nil {
			t.Skipf("mknod: %v (needs root)", err)
		}
		return p
	}
	devA := unix.Mkdev(7, 200)
	a1, a2 := node("a1", devA), node("a2", devA)
	other := node("b", unix.Mkdev(7, 201))
	fsDev := node("fs", fst.Dev)
	for _, c := range []struct {
		journal, member, why string
	}{
		{a1, a2, "same block device"},
		{a1, other, ""},
		{file, fsDev, "is a file on a filesystem of member"},
		{fsDev, file, "block device holding the filesystem of member"},
		{file, other, ""},
		{"volatile:" + a1, "faulty:" + a2 + "?delay=1ms", "same block device"},
	} {
		err := checkJournalPlacement(c.journal, []string{other + ".absent", c.member})
		if c.why == "" {
			if err != nil {
				t.Errorf("journal %s, member %s: %v", c.journal, c.member, err)
			}
			continue
		}
		if !errors.Is(err, ErrJournalOnMember) || !strings.Contains(err.Error(), c.why) || !strings.Contains(err.Error(), c.member) {
			t.Errorf("journal %s, member %s: %v; want ErrJournalOnMember, %q", c.journal, c.member, err, c.why)
		}
	}
}
