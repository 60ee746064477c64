package vm

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProfile runs guest/profile.sh in one boot (make profile-vm; RAID5D_VM_PROFILE=DIR): raid5d
// and md+nbdkit behind the kernel client with 1, 2 and 4 connections, random 4 KiB and 48 KiB
// jobs, the servers' CPU time per request, and raid5d's CPU profiles written to DIR (read them
// with go tool pprof on the static raid5d the test also copies there). It asserts nothing about
// speed. RUNTIME, SIZE and SPECS pass through to the guest.
func TestProfile(t *testing.T) {
	dir := os.Getenv("RAID5D_VM_PROFILE")
	if dir == "" {
		t.Skip("a diagnostic: make profile-vm runs it (RAID5D_VM_PROFILE=DIR)")
	}
	needGuest(t, "nbd-client", "mdadm", "fio", "nbdkit")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	res := runVM(t, vmRun{
		script:  guestScript(t, "profile.sh"),
		modules: []string{"nbd", "brd rd_nr=4 rd_size=262144", "crc32c_generic", "raid456"},
		env:     passEnv("RUNTIME", "SIZE", "SPECS", "JOBS", "SERVE_FLAGS", "QUEUE", "TRACE"),
		memMiB:  3072,
		append:  benchAppend,
		timeout: 30 * time.Minute,
	})
	mustPass(t, res)
	names, err := writeProfiles(res.output, dir)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(env.raid5d)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "raid5d"), bin, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(res.output, "\n") {
		if strings.HasPrefix(line, "PROF ") || strings.HasPrefix(line, "vm: ") {
			fmt.Println(line)
		}
	}
	fmt.Printf("profiles in %s: %s (go tool pprof %s/raid5d %s/NAME.pprof)\n", dir, strings.Join(names, " "), dir, dir)
}

// passEnv returns the host's values of the variables that are set, for a run's env.
func passEnv(keys ...string) map[string]string {
	m := map[string]string{}
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			m[k] = v
		}
	}
	return m
}

// writeProfiles decodes the console's PPROF-BEGIN NAME ... PPROF-END blocks (base64) into
// DIR/NAME.pprof and returns the names.
func writeProfiles(console, dir string) ([]string, error) {
	var names []string
	var name string
	var b64 strings.Builder
	sc := bufio.NewScanner(strings.NewReader(console))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "PPROF-BEGIN "):
			name = strings.TrimPrefix(line, "PPROF-BEGIN ")
			b64.Reset()
		case line == "PPROF-END" && name != "":
			data, err := base64.StdEncoding.DecodeString(b64.String())
			if err != nil {
				return names, fmt.Errorf("profile %s: %w", name, err)
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)+".pprof"), data, 0o644); err != nil {
				return names, err
			}
			names = append(names, name)
			name = ""
		case name != "":
			b64.WriteString(line)
		}
	}
	return names, nil
}

// TestWriteProfiles checks that the console's base64 blocks come out as files byte for byte,
// between kernel messages (no VM).
func TestWriteProfiles(t *testing.T) {
	data := []byte("\x1f\x8b\x08 a profile's bytes, long enough to span two base64 lines of the console......")
	enc := base64.StdEncoding.EncodeToString(data)
	console := "[ 1.0] kernel noise\nPROF raid5d-unix 1 randread-4k 100 50\nPPROF-BEGIN raid5d-unix-randread-4k\n" +
		enc[:40] + "\n" + enc[40:] + "\nPPROF-END\nvm: done\n"
	dir := t.TempDir()
	names, err := writeProfiles(console, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "raid5d-unix-randread-4k" {
		t.Fatalf("names %q", names)
	}
	got, err := os.ReadFile(filepath.Join(dir, "raid5d-unix-randread-4k.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(data) {
		t.Fatalf("profile %q, want %q", got, data)
	}
}
