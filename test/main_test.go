package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// raid5dBin is the binary TestMain built; empty in stand-in mode.
var raid5dBin string

// standin is true when RAID5D_E2E_STANDIN=nbdkit asks for nbdkit in place of raid5d serve.
var standin = os.Getenv("RAID5D_E2E_STANDIN") == "nbdkit"

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if v := os.Getenv("RAID5D_E2E_STANDIN"); v != "" && v != "nbdkit" {
		fmt.Fprintf(os.Stderr, "RAID5D_E2E_STANDIN=%q: the only stand-in is nbdkit\n", v)
		return 2
	}
	if standin {
		fmt.Fprintln(os.Stderr, "e2e: RAID5D_E2E_STANDIN=nbdkit: serving with nbdkit, not raid5d")
		return m.Run()
	}
	if bin := os.Getenv("RAID5D_E2E_BIN"); bin != "" {
		raid5dBin = bin
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "raid5d-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := buildRaid5d(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	raid5dBin = bin
	return m.Run()
}

// buildRaid5d builds ./cmd/raid5d from the module root into dir and returns the binary's path.
func buildRaid5d(dir string) (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not inside the module")
	}
	bin := filepath.Join(dir, "raid5d")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/raid5d")
	cmd.Dir = filepath.Dir(gomod)
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building raid5d: %w\n%s", err, stderr.Bytes())
	}
	return bin, nil
}

func TestVersion(t *testing.T) {
	needRaid5d(t)
	out := runTool(t, raid5dBin, "--version")
	if strings.TrimSpace(out) == "" {
		t.Fatal("raid5d --version printed nothing")
	}
}
