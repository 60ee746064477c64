package vm

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// guestTools are the real programs the initramfs carries, with their shared libraries; every
// other command in the guest is a busybox applet. Each test checks the ones it uses with
// needGuest, so a host without nbdkit loses the benchmark's md+nbdkit rows, not the harness.
var guestTools = []string{
	"nbd-client", "mdadm", "fio", "mkfs.ext4", "e2fsck", "blkdiscard", "fstrim", "nbdkit",
}

// hostFiles are copied as they are when the host has them: the configuration the tools read
// (mke2fs without its file makes different filesystems than on the host).
var hostFiles = []string{"/etc/mke2fs.conf"}

// guestInit is /init (busybox's sh; the scripts run in dash): it mounts the pseudo filesystems, installs busybox's applets (never over a
// real tool), brings up loopback, loads the run's modules, runs the run's script and prints its
// exit status on a line of its own, the line the harness looks for, then powers off. A watchdog
// reports a script that overruns its time (D-state processes' kernel stacks, the kernel log).
const guestInit = `#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run /tmp /root /mnt
mount -t tmpfs tmpfs /dev/shm
ip link set lo up
. /etc/vm-env
# the watchdog: a script still running after $VM_WATCHDOG seconds is reported with what the
# kernel and the processes were doing, and the guest powers off with status 124
(
	sleep "$VM_WATCHDOG"
	echo
	echo "vm: WATCHDOG: the script still runs after $VM_WATCHDOG s"
	ps
	for s in /proc/[0-9]*/stat; do
		set -- $(cat "$s" 2>/dev/null)
		[ "${3:-}" = D ] || continue
		echo "vm: process $1 $2 in D state:"
		cat "/proc/$1/stack" 2>/dev/null
	done
	dmesg | tail -n 60
	echo "` + exitMarker + `124"
	poweroff -f
) &
rc=0
while read -r ko args; do
	[ -n "$ko" ] || continue
	insmod "$ko" $args || { echo "vm: insmod $ko $args failed"; rc=125; }
done < /etc/vm-modules
if [ $rc = 0 ]; then
	cd /root
	dash -c '. /vm/lib.sh; . /vm/run.sh' < /dev/null
	rc=$?
fi
sync
echo
echo "` + exitMarker + `$rc"
poweroff -f
sleep 10
`

// exitMarker starts the console line that carries the guest script's exit status.
const exitMarker = "RAID5D-VM-EXIT="

// baseImage is the part of every initramfs that does not change between runs: busybox, the real
// tools and their libraries, raid5d, the init. It is built once per test binary.
type baseImage struct {
	path    string          // the cpio archive
	busybox string          // the host's static busybox (copied in; also the forward's nc, see boot)
	tools   map[string]bool // guestTools found on the host and copied
	missing []string        // guestTools the host does not have
	libDirs []string        // directories holding the copied libraries, for LD_LIBRARY_PATH
}

// buildBase writes the base archive to dst, with raid5d (a static binary) at /usr/bin/raid5d,
// and the static binary RAID5D_VM_B names, if set, at /usr/bin/raid5d-b.
func buildBase(dst, raid5d string) (*baseImage, error) {
	img := &baseImage{path: dst, tools: map[string]bool{}}
	busybox, err := lookTool("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox (Debian package busybox-static): %w", err)
	}
	if dynamic, err := isDynamic(busybox); err != nil || dynamic {
		return nil, fmt.Errorf("%s is not a static binary (%v): install busybox-static", busybox, err)
	}
	files := map[string]string{} // guest path -> host file
	files["/bin/busybox"] = busybox
	img.busybox = busybox
	// the scripts' shell: busybox's sh runs its own applets before any program on PATH, so
	// blkdiscard would be busybox's and not util-linux's
	dash, err := lookTool("dash")
	if err != nil {
		return nil, err
	}
	files[dash] = dash
	bins := []string{dash}
	files["/usr/bin/raid5d"] = raid5d
	if b := os.Getenv("RAID5D_VM_B"); b != "" {
		// a second raid5d for A/B runs (bench.sh's raid5d-b): a static build of another commit
		if dynamic, err := isDynamic(b); err != nil || dynamic {
			return nil, fmt.Errorf("RAID5D_VM_B=%s is not a static binary (%v): build it with CGO_ENABLED=0", b, err)
		}
		files["/usr/bin/raid5d-b"] = b
	}
	for _, tool := range guestTools {
		p, err := lookTool(tool)
		if err != nil {
			img.missing = append(img.missing, tool)
			continue
		}
		img.tools[tool] = true
		files[p] = p
		bins = append(bins, p)
	}
	if img.tools["nbdkit"] {
		// the plugin the benchmark uses, found where this nbdkit looks for plugins
		out, err := exec.Command("nbdkit", "--dump-config").Output()
		m := regexp.MustCompile(`(?m)^plugindir=(.*)$`).FindSubmatch(out)
		if err != nil || m == nil {
			return nil, fmt.Errorf("nbdkit --dump-config: no plugindir (%v)", err)
		}
		plugin := filepath.Join(string(m[1]), "nbdkit-file-plugin.so")
		if _, err := os.Stat(plugin); err != nil {
			delete(img.tools, "nbdkit")
			img.missing = append(img.missing, "nbdkit (no file plugin)")
		} else {
			files[plugin] = plugin
			bins = append(bins, plugin)
		}
	}
	libs, err := sharedLibs(bins)
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	for _, l := range libs {
		files[l] = l
		dirs[guestPath(filepath.Dir(l))] = true
	}
	img.libDirs = sortedKeys(dirs)
	for _, f := range hostFiles {
		if _, err := os.Stat(f); err == nil {
			files[f] = f
		}
	}

	out, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	c := newCPIO(out)
	// the host's top-level links of merged /usr (/bin -> usr/bin, ...) so that paths in the
	// binaries (the ELF interpreter, #! lines) resolve as they do on the host
	for _, top := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if target, err := os.Readlink(top); err == nil {
			c.symlink(top, target)
		}
	}
	c.charDev("/dev/console", 0o600, 5, 1)
	c.charDev("/dev/null", 0o666, 1, 3)
	for _, d := range []string{"/proc", "/sys", "/tmp", "/run", "/root", "/mnt", "/usr/local/bin"} {
		c.mkdirAll(d)
	}
	for _, g := range sortedKeys(files) {
		c.copyFile(guestPath(g), files[g])
	}
	c.symlink("/usr/bin/sh", "dash")
	c.file("/init", 0o755, []byte(guestInit))
	if err := c.close(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", dst, err)
	}
	return img, out.Close()
}

// isDynamic reports whether the ELF file p asks for an interpreter (the dynamic loader).
func isDynamic(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return true, nil
		}
	}
	return false, nil
}

// lookTool finds a program on PATH or in the sbin directories (not always on a user's PATH).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// guestPath is where the host file p goes in the guest: its directory with symbolic links
// resolved (so /lib/x/libc.so.6 lands in /usr/lib/x, beside the links the archive makes) and its
// own name kept (mkfs.ext4 stays mkfs.ext4, though it is a link to mke2fs: the name selects
// ext4).
func guestPath(p string) string {
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		dir = filepath.Dir(p)
	}
	return filepath.Join(dir, filepath.Base(p))
}

// sharedLibs lists, sorted, the shared libraries and the ELF interpreter that bins load, as
// ldd reports them. A library ldd cannot find is an error.
func sharedLibs(bins []string) ([]string, error) {
	seen := map[string]bool{}
	for _, b := range bins {
		out, err := exec.Command("ldd", b).CombinedOutput()
		if err != nil {
			if bytes.Contains(out, []byte("not a dynamic executable")) {
				continue
			}
			return nil, fmt.Errorf("ldd %s: %w\n%s", b, err, out)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if strings.Contains(line, "not found") {
				return nil, fmt.Errorf("ldd %s: %s", b, line)
			}
			// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
			f := strings.Fields(line)
			var lib string
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				lib = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				lib = f[0]
			}
			if lib != "" {
				seen[lib] = true
			}
		}
	}
	return sortedKeys(seen), nil
}

// runImage writes the part of an initramfs that is one run's own: its script, the shared guest
// library, the modules it loads (in order, with parameters) and its environment.
func runImage(dst string, k *kernel, img *baseImage, script string, modules []string, env map[string]string) (cmdline []string, err error) {
	var names []string
	params := map[string]string{}
	for _, m := range modules {
		name, args, _ := strings.Cut(m, " ")
		name = strings.ReplaceAll(name, "-", "_")
		names = append(names, name)
		params[name] = args
	}
	order, err := k.loadOrder(names)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if k.builtin[n] {
			for _, a := range strings.Fields(params[n]) {
				cmdline = append(cmdline, n+"."+a) // a built-in module takes its parameters here
			}
		}
	}
	out, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	c := newCPIO(out)
	var list strings.Builder
	for _, m := range order {
		p := "/lib/modules/" + k.version + "/" + m.name + ".ko"
		c.file(p, 0o644, m.object)
		fmt.Fprintf(&list, "%s %s\n", p, params[m.name])
	}
	c.file("/etc/vm-modules", 0o644, []byte(list.String()))
	var e strings.Builder
	fmt.Fprintf(&e, "export LD_LIBRARY_PATH=%s\n", shellQuote(strings.Join(img.libDirs, ":")))
	for _, name := range sortedKeys(env) {
		fmt.Fprintf(&e, "export %s=%s\n", name, shellQuote(env[name]))
	}
	c.file("/etc/vm-env", 0o644, []byte(e.String()))
	lib, err := guestScripts.ReadFile("guest/lib.sh")
	if err != nil {
		return nil, err
	}
	c.file("/vm/lib.sh", 0o644, lib)
	c.file("/vm/run.sh", 0o755, []byte(script))
	if err := c.close(); err != nil {
		return nil, fmt.Errorf("writing %s: %w", dst, err)
	}
	return cmdline, out.Close()
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
