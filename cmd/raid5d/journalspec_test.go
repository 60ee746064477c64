package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAbsMemberSpecs: absMember (serve's members and --journal, the management commands'
// MEMBER) makes only the PATH of a faulty: or volatile: spec absolute.
func TestAbsMemberSpecs(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"m0.img":                       wd + "/m0.img",
		"/abs/m0.img":                  "/abs/m0.img",
		"faulty:m0.img?wfail=all":      "faulty:" + wd + "/m0.img?wfail=all",
		"volatile:j.log":               "volatile:" + wd + "/j.log",
		"volatile:sub/j.log?delay=1ms": "volatile:" + wd + "/sub/j.log?delay=1ms",
		"volatile:/abs/j.log":          "volatile:/abs/j.log",
		"nbd+unix:///x?socket=s.sock":  "nbd+unix:///x?socket=" + wd + "/s.sock",
		"nbd://host/x":                 "nbd://host/x",
	} {
		if got, err := absMember(in); err != nil || got != want {
			t.Errorf("absMember(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestJournalSpecPaths: serve --journal volatile:REL and a configuration file's journal and
// member specs resolve only their PATH (from the working directory, or the file's directory),
// as --print-config shows.
func TestJournalSpecPaths(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	code, out, errOut := runCLI(t, "serve", "--print-config", "--journal", "volatile:j.log", "volatile:m0.img", "m1.img", "m2.img")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`journal = "volatile:` + dir + `/j.log"  # command line`,
		`members = ["volatile:` + dir + `/m0.img", "` + dir + `/m1.img", "` + dir + `/m2.img"]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %s:\n%s", want, out)
		}
	}
	cfgDir := filepath.Join(dir, "etc")
	if err := os.Mkdir(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(cfgDir, "a.toml")
	writeFile(t, cfg, `members = ["volatile:m0.img?rfail=0+4K", "m1.img", "faulty:m2.img?volatile"]
journal = "volatile:j/j.log"
`)
	code, out, errOut = runCLI(t, "serve", "--config", cfg, "--print-config")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`journal = "volatile:` + cfgDir + `/j/j.log"  # ` + cfg,
		`members = ["volatile:` + cfgDir + `/m0.img?rfail=0+4K", "` + cfgDir + `/m1.img", "faulty:` + cfgDir + `/m2.img?volatile"]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %s:\n%s", want, out)
		}
	}
}

// TestCreateJournalPlacement: create --journal volatile:REL makes the journal file PATH (not a
// file named "volatile:...") and records the spec with PATH absolute; a journal beside the
// members gets a warning; a journal that is a member's own file (a hard link) is refused
// naming both, with every member byte unchanged.
func TestCreateJournalPlacement(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	ms := []string{"m0.img", "m1.img", "m2.img"}
	code, out, errOut := runCLI(t, append([]string{"create", "--size", "8M", "--consistency", "journal",
		"--journal", "volatile:j.log", "--journal-size", "2M"}, ms...)...)
	if code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "journal: volatile:"+dir+"/j.log") {
		t.Errorf("create output does not name the recorded journal spec:\n%s", out)
	}
	if !strings.Contains(errOut, "warning: journal j.log is on the same filesystem as member m0.img") {
		t.Errorf("no warning about the journal beside the members:\n%s", errOut)
	}
	if fi, err := os.Stat("j.log"); err != nil || fi.Size() != 2<<20 {
		t.Fatalf("journal file j.log: %v", err)
	}
	if ents, _ := filepath.Glob("volatile:*"); len(ents) != 0 {
		t.Fatalf("files named after the spec: %v", ents)
	}
	code, out, errOut = runCLI(t, append([]string{"status"}, ms...)...)
	if code != 0 || !strings.Contains(out, "volatile:"+dir+"/j.log") {
		t.Errorf("status: exit %d\n%s%s", code, out, errOut)
	}

	// A hard link of a member as the journal of a new array.
	if err := os.Link("m2.img", "link.img"); err != nil {
		t.Fatal(err)
	}
	var before [][]byte
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, b)
	}
	code, out, errOut = runCLI(t, append([]string{"create", "--force", "--consistency", "journal", "--journal", "link.img"}, ms...)...)
	if code == 0 || !strings.Contains(errOut, "link.img is the same file as member m2.img") {
		t.Fatalf("create with a member's hard link as journal: exit %d\n%s%s", code, out, errOut)
	}
	for i, m := range ms {
		if b, _ := os.ReadFile(m); !bytes.Equal(b, before[i]) {
			t.Fatalf("the refused create changed %s", m)
		}
	}
}
