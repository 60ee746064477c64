package nbd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/raid5d/raid5d/nbd/nbdtest"
)

// need skips the test when a tool is missing, unless RAID5D_REQUIRE_TOOLS=1 (CI), which fails it.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("RAID5D_REQUIRE_TOOLS") == "1" {
				t.Fatalf("%s is required (RAID5D_REQUIRE_TOOLS=1): %v", tool, err)
			}
			t.Skipf("%s not installed", tool)
		}
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func TestNbdinfo(t *testing.T) {
	need(t, "nbdinfo")
	_, _, path := serveUnix(t, Options{Exports: []Export{
		{Name: "disk", Description: "raid5d test", Device: nbdtest.NewMemDevice(testSize), PreferredBlock: 65536},
		{Name: "ro", Device: nbdtest.NewMemDevice(testSize / 2), ReadOnly: true},
	}})
	for _, tt := range []struct {
		export string
		want   map[string]any
	}{
		{"", map[string]any{
			"export-size": float64(testSize), "block_size_minimum": float64(512),
			"block_size_preferred": float64(65536), "block_size_maximum": float64(32 << 20),
			"can_flush": true, "can_fua": true, "can_trim": true, "can_zero": true,
			"can_multi_conn": true, "is_read_only": false, "can_df": true, "can_cache": false,
			"can_fast_zero": false, "description": "raid5d test",
		}},
		{"ro", map[string]any{
			"export-size": float64(testSize / 2), "block_size_minimum": float64(512),
			"block_size_preferred": float64(4096), "block_size_maximum": float64(32 << 20),
			"can_flush": true, "can_fua": false, "can_trim": false, "can_zero": false,
			"can_multi_conn": true, "is_read_only": true,
		}},
	} {
		t.Run("export="+tt.export, func(t *testing.T) {
			out := run(t, "nbdinfo", "--json", fmt.Sprintf("nbd+unix:///%s?socket=%s", tt.export, path))
			var info struct {
				Protocol string           `json:"protocol"`
				Exports  []map[string]any `json:"exports"`
			}
			if err := json.Unmarshal([]byte(out), &info); err != nil {
				t.Fatalf("nbdinfo output: %v\n%s", err, out)
			}
			if info.Protocol != "newstyle-fixed" || len(info.Exports) != 1 {
				t.Fatalf("nbdinfo: protocol %q, %d exports\n%s", info.Protocol, len(info.Exports), out)
			}
			for k, v := range tt.want {
				if got, ok := info.Exports[0][k]; !ok || got != v {
					t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
				}
			}
		})
	}
	t.Run("list", func(t *testing.T) {
		out := run(t, "nbdinfo", "--list", "--json", "nbd+unix:///?socket="+path)
		if !strings.Contains(out, `"export-name": "disk"`) || !strings.Contains(out, `"export-name": "ro"`) {
			t.Errorf("nbdinfo --list does not name both exports:\n%s", out)
		}
	})
}

// TestQemuIO writes patterns at odd offsets and lengths with qemu-io, reads them back with
// pattern checks, discards and zeroes ranges, and compares every byte of the device with a model.
// With stable pages, the device holds each write's buffer until a background goroutine
// releases it, and DebugImmutable makes the held buffers read-only.
func TestQemuIO(t *testing.T) {
	need(t, "qemu-io")
	t.Run("WriteAt", func(t *testing.T) { qemuIO(t, false) })
	t.Run("StablePages", func(t *testing.T) { qemuIO(t, true) })
}

func qemuIO(t *testing.T, stable bool) {
	const size = 4 << 20
	var mem *nbdtest.MemDevice
	var dev Device
	if stable {
		pdev := nbdtest.NewPinnedDevice(size)
		mem, dev = pdev.MemDevice, pdev
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(stopped)
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Microsecond):
					pdev.ReleaseAll()
				}
			}
		}()
		t.Cleanup(func() { // runs after Serve has returned, which needs the releases
			close(stop)
			<-stopped
			if err := pdev.Err(); err != nil {
				t.Error(err)
			}
			if pdev.Pins() == 0 || pdev.Pins() != pdev.Releases() {
				t.Errorf("%d WritePinned, %d releases; want equal and > 0", pdev.Pins(), pdev.Releases())
			}
		})
	} else {
		mem = nbdtest.NewMemDevice(size)
		dev = mem
	}
	_, _, path := serveUnix(t, Options{
		Exports:        []Export{{Name: "disk", Device: dev, StablePages: stable}},
		DebugImmutable: stable,
	})
	model := make([]byte, size)
	fill := func(b byte, off, n int) {
		for i := off; i < off+n; i++ {
			model[i] = b
		}
	}
	type op struct {
		cmd        string
		b          byte
		off, n     int
		modelWrite bool
	}
	var cmds []string
	for _, o := range []op{
		{"write -P 0x%02x %d %d", 0xab, 0, 65536, true},
		{"write -P 0x%02x %d %d", 0x11, 1000, 3001, true},                // unaligned both ends
		{"write -P 0x%02x %d %d", 0x22, 65536 - 7, 131072 + 13, true},    // across 64 KiB boundaries
		{"write -f -P 0x%02x %d %d", 0x33, 1<<20 + 511, 1<<20 + 2, true}, // FUA, 1 MiB+, odd
		{"write -P 0x%02x %d %d", 0x44, size - 777, 777, true},           // the last bytes
		{"read -P 0x%02x %d %d", 0xab, 0, 1000, false},
		{"read -P 0x%02x %d %d", 0x11, 1000, 3001, false},
		{"read -P 0x%02x %d %d", 0x22, 65536 - 7, 131072 + 13, false},
		{"read -P 0x%02x %d %d", 0x33, 1<<20 + 511, 1<<20 + 2, false},
		{"read -P 0x%02x %d %d", 0x44, size - 777, 777, false},
	} {
		cmds = append(cmds, fmt.Sprintf(o.cmd, o.b, o.off, o.n))
		if o.modelWrite {
			fill(o.b, o.off, o.n)
		}
	}
	// Discard and write zeroes: whole aligned ranges, which must read back as zeroes.
	cmds = append(cmds,
		"discard 2097152 262144", "read -P 0 2097152 262144",
		"write -z 3145728 131072", "read -P 0 3145728 131072",
		"write -z -u 3407872 65536", "read -P 0 3407872 65536",
		"flush")
	fill(0, 2097152, 262144)
	fill(0, 3145728, 131072)
	fill(0, 3407872, 65536)

	// qemu-io's default cache mode is writethrough, which makes every write FUA (never pinned);
	// writeback sends plain writes and the one FLUSH at the end.
	args := []string{"-f", "raw", "-t", "writeback"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out := run(t, "qemu-io", append(args, "nbd+unix:///disk?socket="+path)...)
	if strings.Contains(out, "failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io reported a failure:\n%s", out)
	}
	checkDevice(t, mem, model)
	if st := mem.Stats(); st.Trims == 0 || st.WriteZeroes == 0 || st.Flushes == 0 {
		t.Errorf("qemu-io should have sent TRIM, WRITE_ZEROES and FLUSH: %+v", st)
	}
}
