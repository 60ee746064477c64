package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// serveFlagNames returns the names of raid5d serve's flags, read from its --help.
func serveFlagNames(t *testing.T) []string {
	t.Helper()
	code, out, _ := runCLI(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d", code)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`).FindAllStringSubmatch(out, -1) {
		if !notConfigKey(m[1]) {
			names = append(names, m[1])
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d flags in serve --help:\n%s", len(names), out)
	}
	return names
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConfigExample: dist/raid5d.example.toml parses, documents every serve flag as a key (so a
// new flag without an example line fails here), and its active settings are what
// --print-config reports.
func TestConfigExample(t *testing.T) {
	example, err := filepath.Abs("../../dist/raid5d.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range serveFlagNames(t) {
		if !regexp.MustCompile(`(?m)^#? ?` + regexp.QuoteMeta(name) + ` = `).Match(data) {
			t.Errorf("the example config has no line for serve flag --%s (want %q or a commented default)", name, name+" = ...")
		}
	}
	code, out, errOut := runCLI(t, "serve", "--config", example, "--print-config")
	if code != 0 {
		t.Fatalf("serve --config example --print-config: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`members = ["/var/lib/raid5d/example/m0.img", "/var/lib/raid5d/example/m1.img", "/var/lib/raid5d/example/m2.img", "/var/lib/raid5d/example/m3.img"]  # ` + example,
		`listen = "127.0.0.1:10809"  # ` + example,
		`# stable-pages = true  # default`,
		`log-format = "text"  # ` + example,
		`# max-connections = 128  # default`,
		`# max-in-flight = 64  # default`,
		`# mlock = false  # default`,
		`# sched-batch = true  # default`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
}

// TestConfigOverrides: relative paths resolve against the file's directory, the command line
// wins over the file (flags and members), repeatable flags take arrays, and --print-config's
// output reads back as the same settings.
func TestConfigOverrides(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "a.toml")
	writeFile(t, cfg, `# test
members = ["m0.img", "sub/m1.img", "/abs/m2.img", "faulty:m3.img?fail-read=1"]
listen = "127.0.0.1:1234"
socket = "nbd.sock"
tls-cert = "/etc/x.pem"
max-connections = 7
max-in-flight = 256
handshake-timeout = "3s"
stable-pages = false
allow-client = ["alice", "bob"]
allow-uid = [0, 1000]
stripe-cache = 32
sync-speed-max = "50M"
export = "from-file"
`)
	code, out, errOut := runCLI(t, "serve", "--config", cfg, "--print-config", "--max-connections", "9", "--export", "cli")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`members = ["` + dir + `/m0.img", "` + dir + `/sub/m1.img", "/abs/m2.img", "faulty:` + dir + `/m3.img?fail-read=1"]  # ` + cfg,
		`listen = "127.0.0.1:1234"  # ` + cfg,
		`socket = "` + dir + `/nbd.sock"  # ` + cfg,
		`tls-cert = "/etc/x.pem"  # ` + cfg,
		`max-connections = 9  # command line`,
		`max-in-flight = 256  # ` + cfg,
		`export = "cli"  # command line`,
		`handshake-timeout = "3s"  # ` + cfg,
		`stable-pages = false  # ` + cfg,
		`allow-client = ["alice", "bob"]  # ` + cfg,
		`allow-uid = [0, 1000]  # ` + cfg,
		`stripe-cache = "32"  # ` + cfg,
		`sync-speed-max = "50M"  # ` + cfg,
		`# read-only = false  # default`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}

	// Members on the command line replace the file's.
	code, out2, _ := runCLI(t, "serve", "--config", cfg, "--print-config", "/x/only.img")
	if code != 0 || !strings.Contains(out2, `members = ["/x/only.img"]  # command line`) {
		t.Errorf("command-line members: exit %d\n%s", code, out2)
	}

	// The printed settings read back as the same settings.
	again := filepath.Join(t.TempDir(), "printed.toml")
	writeFile(t, again, out)
	code, out3, errOut := runCLI(t, "serve", "--config", again, "--print-config")
	if code != 0 {
		t.Fatalf("reading --print-config's output back: exit %d\n%s%s", code, out3, errOut)
	}
	settings := func(s string) []string {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				keep = append(keep, l[:strings.LastIndex(l, "  # ")])
			}
		}
		return keep
	}
	a, b := settings(out), settings(out3)
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Errorf("settings differ after a round trip:\n%s\n---\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
}

// TestConfigErrors: every mistake is a usage error (exit 2) naming the file's line and the key.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"typo", "members = [\"a\"]\n\nlisen = \"127.0.0.1:1\"\n", []string{"line 3", `unknown key "lisen"`, `did you mean "listen"?`}},
		{"underscore", "read_only = true\n", []string{"line 1", `unknown key "read_only"`, `did you mean "read-only"?`}},
		{"quoted", "\n\"max-conections\" = 3\n", []string{"line 2", `unknown key "max-conections"`, `"max-connections"`}},
		{"not a key", "print-config = true\n", []string{"line 1", `unknown key "print-config"`}},
		{"table", "members = []\n[limits]\nmax-connections = 3\n", []string{"line 2", `unknown key "limits"`}},
		{"flag as table", "[tls]\ncert = \"x\"\n", []string{"line 1", `"tls" is a table`}},
		{"dotted", "\nstable-pages.x = true\n", []string{"line 2", `"stable-pages.x"`}},
		{"bool type", "\nstable-pages = \"yes\"\n", []string{"line 2", "stable-pages", `want true or false, got the string "yes"`}},
		{"string type", "listen = true\n", []string{"line 1", "listen", "want a string or an integer, got the boolean true"}},
		{"array for one", "listen = [\"a\", \"b\"]\n", []string{"line 1", "listen", "takes one value"}},
		{"float", "max-connections = 1.5\n", []string{"line 1", "the float 1.5"}},
		{"in flight 0", "\nmax-in-flight = 0\n", []string{"line 2", "max-in-flight", "want 1 to 4096"}},
		{"in flight negative", "max-in-flight = -1\n", []string{"line 1", "max-in-flight", "want 1 to 4096"}},
		{"in flight absurd", "max-in-flight = 1000000\n", []string{"line 1", "max-in-flight", "want 1 to 4096"}},
		{"bad value", "\n\nhandshake-timeout = \"soon\"\n", []string{"line 3", "handshake-timeout", `"soon"`}},
		{"members type", "members = \"m0.img\"\n", []string{"line 1", "members", "want an array of paths"}},
		{"syntax", "listen = \"127.0.0.1\n", []string{"line 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".toml")
			writeFile(t, cfg, tc.text)
			code, out, errOut := runCLI(t, "serve", "--config", cfg, "--print-config")
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s%s", code, out, errOut)
			}
			for _, w := range append(tc.want, cfg) {
				if !strings.Contains(errOut, w) {
					t.Errorf("error lacks %q: %s", w, errOut)
				}
			}
		})
	}
	code, _, errOut := runCLI(t, "serve", "--config", filepath.Join(dir, "missing.toml"))
	if code != 1 || !strings.Contains(errOut, "missing.toml") {
		t.Errorf("missing file: exit %d, %s", code, errOut)
	}
}

// TestConfigRemotePaths: the remote members' TLS files (member-tls-ca, -cert, -key) and the
// paths inside a member URI (socket=, tls-certificates=) resolve against the file's directory
// as member paths do; absolute paths, hosts and the rest of a URI stay as written.
func TestConfigRemotePaths(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "r.toml")
	writeFile(t, cfg, `members = ["nbd+unix:///a?socket=run/a.sock", "nbds+unix:///b?socket=/abs/b.sock&tls-certificates=pki", "nbds://host:10809/c?tls-certificates=/etc/pki", "nbd://host/d"]
member-tls-ca = "pki/ca-cert.pem"
member-tls-cert = "pki/client-cert.pem"
member-tls-key = "/etc/pki/client-key.pem"
`)
	code, out, errOut := runCLI(t, "serve", "--config", cfg, "--print-config")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`members = ["nbd+unix:///a?socket=` + dir + `/run/a.sock", "nbds+unix:///b?socket=/abs/b.sock&tls-certificates=` + dir + `/pki", "nbds://host:10809/c?tls-certificates=/etc/pki", "nbd://host/d"]  # ` + cfg,
		`member-tls-ca = "` + dir + `/pki/ca-cert.pem"  # ` + cfg,
		`member-tls-cert = "` + dir + `/pki/client-cert.pem"  # ` + cfg,
		`member-tls-key = "/etc/pki/client-key.pem"  # ` + cfg,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
}
