package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzConfigFile: whatever a configuration file holds, `serve --config FILE --print-config`
// never panics and either refuses it as a usage error (exit 2) or prints settings that, read
// back as a configuration file, print the same again: what --print-config says is what serve
// would run with, and its output is a file serve accepts.
func FuzzConfigFile(f *testing.F) {
	if ex, err := os.ReadFile("../../dist/raid5d.example.toml"); err == nil {
		f.Add(string(ex))
	}
	for _, s := range []string{
		"members = [\"m0.img\", \"/abs/m1.img\", \"nbd://h/e\", \"faulty:m2.img?fail-after=1M\"]\nlisten = \"127.0.0.1:1\"\n",
		"read-only = true\nstripe-cache = \"64M\"\nmember-timeout = \"3s\"\n",
		"journal = \"volatile:j.img\"\nexport = \"a\\\"b\"\n",
		"max-connections = 3\n[t]\nx = 1\n",
		"max-in-flight = 4096\nmember-conns = 16\n",
		"max-in-flight = \"0x10\"\n",
		"listen = \"\\u0001\"\nspare = [\"s.img\"]\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		dir := t.TempDir()
		first, second := filepath.Join(dir, "first.toml"), filepath.Join(dir, "again.toml")
		if err := os.WriteFile(first, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := run([]string{"serve", "--config", first, "--print-config"}, &out, &errOut)
		if code == 2 {
			return
		}
		if code != 0 {
			t.Fatalf("exit %d, want 0 or 2 (usage)\nconfig:\n%s\nstderr: %s", code, text, errOut.String())
		}
		if err := os.WriteFile(second, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		var out2, errOut2 bytes.Buffer
		if code := run([]string{"serve", "--config", second, "--print-config"}, &out2, &errOut2); code != 0 {
			t.Fatalf("the printed config is refused (exit %d): %s\nconfig:\n%s\nprinted:\n%s", code, errOut2.String(), text, out.String())
		}
		// The settings now come from the second file: the same directory, a name as long.
		want := strings.ReplaceAll(out.String(), first, second)
		if out2.String() != want {
			t.Fatalf("the printed config reads back as different settings\nconfig:\n%s\nprinted:\n%s\nprinted again:\n%s", text, out.String(), out2.String())
		}
	})
}
