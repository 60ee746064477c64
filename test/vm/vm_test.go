package vm

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

//go:embed guest/*.sh
var guestScripts embed.FS

// env is what TestMain's lazy setup made once for every test: the kernel, the base image and
// how to run qemu. setupErr says why not; skip says whether that only means "no VM here".
var env struct {
	once     sync.Once
	dir      string // temporary directory, removed by TestMain
	qemu     string
	kernel   *kernel
	image    string // what qemu's -kernel boots: the PVH vmlinux if there is one
	raid5d   string // the static raid5d the guest gets; the host can run it too
	base     *baseImage
	accel    []string // qemu's -accel and -cpu arguments
	setupErr error
	skip     bool
}

func TestMain(m *testing.M) {
	code := m.Run()
	if env.dir != "" {
		os.RemoveAll(env.dir)
	}
	os.Exit(code)
}

// requireTools reports whether RAID5D_REQUIRE_TOOLS=1 (CI): then anything missing fails.
func requireTools() bool { return os.Getenv("RAID5D_REQUIRE_TOOLS") == "1" }

// needVM returns once the VM can run, building what it needs on first use; it skips the test
// when qemu or a kernel cannot be had here (and fails it under RAID5D_REQUIRE_TOOLS=1).
func needVM(t *testing.T) {
	t.Helper()
	env.once.Do(setup)
	if env.setupErr == nil {
		return
	}
	if env.skip && !requireTools() {
		t.Skipf("no VM: %v (make deps installs what it needs)", env.setupErr)
	}
	t.Fatalf("VM setup: %v", env.setupErr)
}

// needGuest skips (or fails under RAID5D_REQUIRE_TOOLS=1) unless the initramfs carries tools.
func needGuest(t *testing.T, tools ...string) {
	t.Helper()
	needVM(t)
	for _, tool := range tools {
		if !env.base.tools[tool] {
			msg := fmt.Sprintf("the host has no %s to copy into the guest (make deps installs it)", tool)
			if requireTools() {
				t.Fatal("RAID5D_REQUIRE_TOOLS=1 but " + msg)
			}
			t.Skip(msg)
		}
	}
}

func setup() {
	skip := func(err error) { env.setupErr, env.skip = err, true }
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		skip(fmt.Errorf("qemu-system-x86_64 not found (Debian package qemu-system-x86)"))
		return
	}
	env.qemu = qemu
	cache := os.Getenv("RAID5D_VM_CACHE")
	if cache == "" {
		cache = ".cache" // test/vm/.cache: go test runs in the package's directory; ignored by git
	}
	if cache, err = filepath.Abs(cache); err != nil {
		env.setupErr = err
		return
	}
	pkg, err := kernelPackage()
	if err != nil {
		skip(err)
		return
	}
	if env.kernel, err = fetchKernel(cache, pkg); err != nil {
		skip(err)
		return
	}
	if env.dir, err = os.MkdirTemp("", "raid5d-vm"); err != nil {
		env.setupErr = err
		return
	}
	bin, err := buildStatic(env.dir)
	if err != nil {
		env.setupErr = err
		return
	}
	env.raid5d = bin
	if env.base, err = buildBase(filepath.Join(env.dir, "base.cpio"), bin); err != nil {
		skip(err) // busybox-static missing, most likely
		return
	}
	env.image = env.kernel.pvhImage()
	if env.image == "" {
		env.image = env.kernel.image
	}
	env.accel, err = pickAccel(cache)
	if err != nil {
		env.setupErr = err
	}
}

// buildStatic builds ./cmd/raid5d without cgo (a static binary, needing nothing in the guest).
func buildStatic(dir string) (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside the module")
	}
	bin := filepath.Join(dir, "raid5d")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/raid5d")
	cmd.Dir = filepath.Dir(gomod)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building a static raid5d: %w\n%s", err, out)
	}
	return bin, nil
}

// pickAccel chooses TCG, unless a stock kernel is known to boot under KVM here: some hosts
// expose /dev/kvm but only run specially built guest kernels, and a stock kernel hangs there.
// $RAID5D_VM_ACCEL (tcg or kvm) decides; otherwise a probe boot under KVM (bounded) decides
// once per host and guest kernel, remembered in the cache directory.
func pickAccel(cache string) ([]string, error) {
	tcg := []string{"-accel", "tcg,thread=multi", "-cpu", "max"}
	kvm := []string{"-accel", "kvm", "-cpu", "host"}
	switch a := os.Getenv("RAID5D_VM_ACCEL"); a {
	case "tcg":
		return tcg, nil
	case "kvm":
		return kvm, nil
	case "", "auto":
	default:
		return nil, fmt.Errorf("RAID5D_VM_ACCEL=%q: want tcg, kvm or auto", a)
	}
	if unix.Access("/dev/kvm", unix.R_OK|unix.W_OK) != nil {
		return tcg, nil
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	memo := filepath.Join(cache, "accel-"+unix.ByteSliceToString(uts.Release[:])+"-"+env.kernel.version)
	if b, err := os.ReadFile(memo); err == nil {
		if strings.TrimSpace(string(b)) == "kvm" {
			return kvm, nil
		}
		return tcg, nil
	}
	choice := "tcg"
	res, err := boot(vmRun{name: "kvm-probe", script: "echo kvm works", timeout: 45 * time.Second}, kvm)
	if err == nil && res.status == 0 && strings.Contains(res.output, "kvm works") {
		choice = "kvm"
	}
	_ = os.WriteFile(memo, []byte(choice+"\n"), 0o644)
	if choice == "kvm" {
		return kvm, nil
	}
	return tcg, nil
}

// vmRun is one boot: a script for the guest's sh, after /vm/lib.sh (guest/lib.sh).
type vmRun struct {
	name    string            // for the log
	script  string            // run by dash after /vm/lib.sh (which sets -eu)
	modules []string          // loaded in order before the script, with their dependencies: "brd rd_nr=4"
	env     map[string]string // exported to the script
	memMiB  int               // guest memory; default 1024
	cpus    int               // default 2
	timeout time.Duration     // the whole boot, qemu killed after it; default 4 minutes
	net     bool              // an e1000 NIC on qemu's user network, restricted (load the e1000 module)
	forward string            // with net: the host's 127.0.0.1 port guestFwdAddr:guestFwdPort reaches
	append  []string          // added to the kernel's command line (then $RAID5D_VM_APPEND's words)
}

// benchAppend is the benchmarks' kernel command line: under TCG the kernel finds the TSC
// unreliable and keeps time with the HPET, which the vDSO cannot read, so every clock read is a
// system call and an emulated device access. Go's scheduler and raid5d read the clock several
// times per request and nbdkit almost never, so the HPET charged raid5d about 4x its CPU per
// 4 KiB and 48 KiB write (1.1-1.4x per 4 KiB read) in one boot that switched between the two
// (guest/profile.sh); on real machines and KVM guests the vDSO reads a TSC or kvm-clock.
// tsc=reliable makes the TSC the clocksource.
var benchAppend = []string{"tsc=reliable"}

// The guest's network (vmRun.net) is qemu's user network with restrict=on: the guest reaches
// nothing outside the VM, not even the host's loopback through 10.0.2.2, except through the one
// forward vmRun.forward asks for. A guestfwd to a chardev is a single connection made at start-up
// and nbd-client -C 2 opens two, so the forward is a command run per connection: the host's
// busybox nc to 127.0.0.1:forward, its stdin and stdout the guest's connection. The script gets
// the forward's address in $FWD_ADDR and $FWD_PORT.
const (
	guestFwdAddr = "10.0.2.100"
	guestFwdPort = "10809"
)

// vmResult is how a boot ended.
type vmResult struct {
	status  int    // the script's exit status
	output  string // the serial console: kernel messages and the script's output, \r removed
	elapsed time.Duration
}

// errNoStatus is returned by boot when the guest ended without reporting an exit status (a
// kernel panic, a hang cut off by the timeout, qemu failing to start).
var errNoStatus = errors.New("vm: the guest reported no exit status")

// exitRE finds the exit marker; the kernel may print on the same line before it.
var exitRE = regexp.MustCompile(exitMarker + `(\d+)`)

// boot runs qemu with the base image and r's own files, until the guest powers off or
// r.timeout passes (then qemu is killed). accel is qemu's accelerator arguments.
func boot(r vmRun, accel []string) (vmResult, error) {
	if r.memMiB == 0 {
		r.memMiB = 1024
	}
	if r.cpus == 0 {
		r.cpus = 2
	}
	if r.timeout == 0 {
		r.timeout = 4 * time.Minute
	}
	dir, err := os.MkdirTemp(env.dir, "run-")
	if err != nil {
		return vmResult{}, err
	}
	defer os.RemoveAll(dir)
	runCPIO := filepath.Join(dir, "run.cpio")
	guestEnv := map[string]string{"VM_WATCHDOG": strconv.Itoa(int(r.timeout.Seconds() * 0.85))}
	if r.forward != "" {
		guestEnv["FWD_ADDR"], guestEnv["FWD_PORT"] = guestFwdAddr, guestFwdPort
	}
	for k, v := range r.env {
		guestEnv[k] = v
	}
	extra, err := runImage(runCPIO, env.kernel, env.base, r.script, r.modules, guestEnv)
	if err != nil {
		return vmResult{}, err
	}
	// qemu takes one initrd file: the base archive and this run's, concatenated
	initrd := filepath.Join(dir, "initrd")
	if err := concat(initrd, env.base.path, runCPIO); err != nil {
		return vmResult{}, err
	}
	cmdline := append([]string{"console=ttyS0", "panic=-1", "quiet", "rdinit=/init"}, extra...)
	cmdline = append(append(cmdline, r.append...), strings.Fields(os.Getenv("RAID5D_VM_APPEND"))...)
	args := append([]string{
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-m", strconv.Itoa(r.memMiB), "-smp", strconv.Itoa(r.cpus),
		"-kernel", env.image, "-initrd", initrd, "-append", strings.Join(cmdline, " "),
	}, accel...)
	if r.net {
		nic := "user,model=e1000,restrict=on"
		if r.forward != "" {
			if strings.ContainsAny(env.base.busybox, ", ") { // qemu's option syntax, the command's argv
				return vmResult{}, fmt.Errorf("vm: busybox's path %q has a comma or space: no guestfwd command", env.base.busybox)
			}
			nic += ",guestfwd=tcp:" + guestFwdAddr + ":" + guestFwdPort + "-cmd:" + env.base.busybox + " nc 127.0.0.1 " + r.forward
		}
		args = append(args, "-nic", nic)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.qemu, args...)
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	var w io.Writer = &out
	if os.Getenv("RAID5D_VM_CONSOLE") == "1" {
		w = io.MultiWriter(&out, os.Stderr)
	}
	cmd.Stdout, cmd.Stderr = w, w
	start := time.Now()
	err = cmd.Run()
	res := vmResult{output: strings.ReplaceAll(out.String(), "\r", ""), elapsed: time.Since(start)}
	m := exitRE.FindAllStringSubmatch(res.output, -1)
	switch {
	case ctx.Err() != nil:
		return res, fmt.Errorf("%w: qemu killed after %v", errNoStatus, r.timeout)
	case m == nil && err != nil:
		return res, fmt.Errorf("%w: qemu: %v", errNoStatus, err)
	case m == nil:
		return res, errNoStatus
	}
	res.status, _ = strconv.Atoi(m[len(m)-1][1])
	return res, nil
}

// runVM boots r and returns how its script ended; a guest that reports no status fails the test.
func runVM(t *testing.T, r vmRun) vmResult {
	t.Helper()
	needVM(t)
	if r.name == "" {
		r.name = t.Name()
	}
	res, err := boot(r, env.accel)
	if err != nil {
		t.Fatalf("%s: %v after %v; console:\n%s", r.name, err, res.elapsed.Round(time.Millisecond), res.output)
	}
	t.Logf("%s: exit status %d after %v", r.name, res.status, res.elapsed.Round(time.Millisecond))
	for _, line := range strings.Split(res.output, "\n") {
		if strings.HasPrefix(line, "vm: KERNEL:") { // guest/lib.sh's nbd_connect: worked around, logged even when passing
			t.Log(line)
		}
	}
	return res
}

// mustPass fails the test, with the console, unless the script exited 0.
func mustPass(t *testing.T, res vmResult) {
	t.Helper()
	if res.status != 0 {
		t.Fatalf("guest script exited %d; console:\n%s", res.status, res.output)
	}
}

// guestScript returns guest/name from the embedded scripts.
func guestScript(t *testing.T, name string) string {
	t.Helper()
	b, err := guestScripts.ReadFile("guest/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// concat writes the files srcs one after the other into dst.
func concat(dst string, srcs ...string) error {
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	for _, s := range srcs {
		in, err := os.Open(s)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		in.Close()
		if err != nil {
			return err
		}
	}
	return out.Close()
}
