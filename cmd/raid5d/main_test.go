package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raid5d/raid5d/raid"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsageAndHelp(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		contains string // in stdout+stderr
	}{
		{nil, 2, "Commands:"},
		{[]string{"--help"}, 0, "Commands:"},
		{[]string{"--version"}, 0, "raid5d "},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"create", "--help"}, 0, "-chunk size"},
		{[]string{"serve", "--help"}, 0, "-socket path"},
		{[]string{"status", "--help"}, 0, "Exit status"},
		{[]string{"create", "a", "b"}, 2, "need at least 3 members"},
		{[]string{"create", "--chunk", "12X", "a", "b", "c"}, 2, "invalid size"},
		{[]string{"create", "--layout", "diagonal", "a", "b", "c"}, 2, "unknown layout"},
		{[]string{"serve"}, 2, "no members given"},
		{[]string{"serve", "--log-format", "xml", "a"}, 2, "--log-format"},
		{[]string{"serve", "--member-conns", "17", "a"}, 2, "want 1 to 16"},
		{[]string{"serve", "--max-in-flight", "0", "a"}, 2, "-max-in-flight: want 1 to 4096"},
		{[]string{"serve", "--max-in-flight", "-64", "a"}, 2, "-max-in-flight: want 1 to 4096"},
		{[]string{"serve", "--max-in-flight", "4097", "a"}, 2, "-max-in-flight: want 1 to 4096"},
		{[]string{"serve", "--max-in-flight", "lots", "a"}, 2, "-max-in-flight: want 1 to 4096"},
		{[]string{"serve", "--help"}, 0, "-max-in-flight n"},
		{[]string{"status", "--control", "/nonexistent/raid5d.sock"}, 2, "no members given"},
	} {
		t.Run(strings.Join(tc.args, "_"), func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.contains) {
				t.Fatalf("exit %d (want %d); output does not contain %q:\n%s%s", code, tc.code, tc.contains, out, errOut)
			}
		})
	}
}

func TestCreateThenStatus(t *testing.T) {
	dir := t.TempDir()
	var ms []string
	for i := range 4 {
		ms = append(ms, filepath.Join(dir, "m"+string(rune('0'+i))))
	}
	// Flags after members work too.
	code, out, errOut := runCLI(t, append(append([]string{"create"}, ms...), "--size", "8M", "--chunk", "16K")...)
	if code != 0 {
		t.Fatalf("create: exit %d: %s%s", code, out, errOut)
	}
	if !strings.Contains(out, "4 members, chunk 16K, left-symmetric") {
		t.Errorf("create output: %s", out)
	}
	code, out, errOut = runCLI(t, append([]string{"status"}, ms...)...)
	if code != 0 || !strings.Contains(out, "state:   clean") {
		t.Fatalf("status: exit %d: %s%s", code, out, errOut)
	}
	// A second create over the same members is refused without --force.
	if code, out, errOut = runCLI(t, append([]string{"create"}, ms...)...); code != 1 {
		t.Fatalf("create over an existing array: exit %d: %s%s", code, out, errOut)
	}
	// One member gone: degraded, exit 3, and the missing member is named.
	if err := os.Remove(ms[2]); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI(t, append([]string{"status"}, ms...)...)
	if code != 3 || !strings.Contains(out, "degraded") || !strings.Contains(out, "missing: role 2") || !strings.Contains(out, ms[2]) {
		t.Fatalf("degraded status: exit %d:\n%s%s", code, out, errOut)
	}
	// Two gone: failed, exit 1.
	if err := os.Remove(ms[0]); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut = runCLI(t, append([]string{"status"}, ms...)...); code != 1 || !strings.Contains(out, "failed") {
		t.Fatalf("failed status: exit %d:\n%s%s", code, out, errOut)
	}
}

func TestStripeCacheFlag(t *testing.T) {
	dir := t.TempDir()
	var ms []string
	for i := range 4 {
		ms = append(ms, filepath.Join(dir, "m"+string(rune('0'+i))))
	}
	if code, out, errOut := runCLI(t, append([]string{"create", "--size", "8M", "--chunk", "16K"}, ms...)...); code != 0 {
		t.Fatalf("create: %s%s", out, errOut)
	}
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},       // unset: the array's default
		{"off", -1},   // write-through
		{"300", 300},  // stripes
		{"1M", 16},    // bytes: 1 MiB / (4 members × 16 KiB)
		{"1K", 1},     // at least one stripe
		{"64M", 1024}, // 64 MiB / 64 KiB
	} {
		var f cacheSizeFlag
		if tc.in != "" {
			if err := f.Set(tc.in); err != nil {
				t.Fatalf("Set(%q): %v", tc.in, err)
			}
		}
		stripes, bytes := f.options()
		a, err := raid.Assemble(ms, raid.AssembleOptions{IOOptions: raid.IOOptions{StripeCache: stripes, StripeCacheBytes: bytes}})
		if err != nil {
			t.Fatal(err)
		}
		got := a.Status().Counters.CacheStripes
		a.Close()
		if tc.want == 0 {
			tc.want = raid.DefaultCacheStripes(a.Layout())
		}
		if tc.want < 0 {
			tc.want = 0 // no heads
		}
		if got != tc.want {
			t.Errorf("--stripe-cache %q: %d stripes, want %d", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"0", "-3", "lots", "0K"} {
		var f cacheSizeFlag
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if code, out, errOut := runCLI(t, append([]string{"serve", "--stable-pages=false", "--debug-immutable"}, ms...)...); code != 2 || !strings.Contains(errOut, "needs stable pages") {
		t.Errorf("--debug-immutable without stable pages: exit %d: %s%s", code, out, errOut)
	}
}

func TestHelpPrintedOnce(t *testing.T) {
	for _, c := range commands {
		code, out, errOut := runCLI(t, c.name, "--help")
		if code != 0 || strings.Count(out, "Usage: raid5d "+c.name) != 1 || errOut != "" {
			t.Errorf("%s --help: exit %d, usage printed %d times, stderr %q", c.name, code, strings.Count(out, "Usage: raid5d "+c.name), errOut)
		}
		code, out, errOut = runCLI(t, c.name, "--no-such-flag")
		if code != 2 || out != "" || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", c.name, code, out, errOut)
		}
	}
}

func TestCreateConsistency(t *testing.T) {
	dir := t.TempDir()
	ms := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")}
	code, out, errOut := runCLI(t, append([]string{"create", "--size", "8M", "--consistency", "ppl"}, ms...)...)
	if code != 1 || !strings.Contains(errOut, "not implemented") {
		t.Fatalf("--consistency ppl: exit %d: %s%s", code, out, errOut)
	}
	if _, err := os.Stat(ms[0]); !os.IsNotExist(err) {
		t.Fatalf("a refused create touched the members: %v", err)
	}
	for _, policy := range []string{"none", "bitmap"} {
		if code, out, errOut := runCLI(t, append([]string{"create", "--force", "--size", "8M", "--consistency", policy}, ms...)...); code != 0 {
			t.Fatalf("--consistency %s: exit %d: %s%s", policy, code, out, errOut)
		}
	}
}
