package vm

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// kernel is a stock Debian kernel unpacked from its package: the image qemu boots and the
// modules tree the initramfs takes its modules from.
type kernel struct {
	image   string // boot/vmlinuz-VERSION
	version string // uname -r in the guest
	modDir  string // lib/modules/VERSION

	modules map[string]string // module name (dashes as underscores) -> file under modDir
	builtin map[string]bool   // modules built into the image (modules.builtin)
}

// kernelPackage names the Debian kernel image package to boot: $RAID5D_VM_KERNEL_PKG, or the
// one the linux-image-amd64 metapackage depends on now (apt-cache), so the cache follows the
// distribution's updates.
func kernelPackage() (string, error) {
	if p := os.Getenv("RAID5D_VM_KERNEL_PKG"); p != "" {
		return p, nil
	}
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-amd64: %w", err)
	}
	m := regexp.MustCompile(`(?m)^\s*Depends:\s*(linux-image-[0-9][^\s]*-amd64)\s*$`).FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("apt-cache depends linux-image-amd64 names no linux-image-VERSION-amd64:\n%s", out)
	}
	return string(m[1]), nil
}

// fetchKernel returns the kernel of package pkg unpacked under cacheDir/pkg, downloading
// (apt-get download, no root needed) and unpacking (dpkg-deb -x) it first if it is not there,
// and then removing the other kernels there. A failed or interrupted fetch leaves nothing under
// the final name.
func fetchKernel(cacheDir, pkg string) (*kernel, error) {
	root := filepath.Join(cacheDir, pkg)
	if k, err := openKernel(root); err == nil {
		return k, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(cacheDir, "fetch-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dl := exec.Command("apt-get", "download", pkg)
	dl.Dir = tmp
	if out, err := dl.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s left %d .deb files in %s", pkg, len(debs), tmp)
	}
	tree := filepath.Join(tmp, "root")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], tree).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dpkg-deb -x %s: %w\n%s", debs[0], err, out)
	}
	if _, err := openKernel(tree); err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	os.RemoveAll(root) // a broken earlier copy
	if err := os.Rename(tree, root); err != nil {
		return nil, err
	}
	// the kernels this one replaces (460 MB each); their KVM probe results stay, they are small
	if old, err := filepath.Glob(filepath.Join(cacheDir, "linux-image-*")); err == nil {
		for _, o := range old {
			if o != root {
				os.RemoveAll(o)
			}
		}
	}
	return openKernel(root)
}

// openKernel reads an unpacked kernel package: one boot/vmlinuz-*, its lib/modules tree and
// the index of the modules in it.
func openKernel(root string) (*kernel, error) {
	images, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return nil, fmt.Errorf("%s: want one boot/vmlinuz-*, found %d", root, len(images))
	}
	k := &kernel{image: images[0], version: strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")}
	k.modDir = filepath.Join(root, "lib", "modules", k.version)
	if _, err := os.Stat(k.modDir); err != nil {
		// merged /usr: the package may put them under usr/lib
		k.modDir = filepath.Join(root, "usr", "lib", "modules", k.version)
	}
	k.modules = map[string]string{}
	err := filepath.WalkDir(k.modDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name, ok := moduleName(d.Name()); ok && !d.IsDir() {
			k.modules[name] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("modules of %s: %w", k.version, err)
	}
	k.builtin = map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(k.modDir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			if name, ok := moduleName(filepath.Base(line)); ok {
				k.builtin[name] = true
			}
		}
	}
	if len(k.modules) == 0 {
		return nil, fmt.Errorf("%s: no modules under %s", root, k.modDir)
	}
	return k, nil
}

// pvhImage returns the kernel as a plain ELF vmlinux, which qemu starts at its PVH entry point,
// made once beside the compressed image: under TCG, decompressing the image in the guest took
// about 9 of a 14 second boot. It returns "" when the image's payload is not xz, zstd or gzip,
// or the kernel has no PVH entry (then boot the compressed image).
func (k *kernel) pvhImage() string {
	vmlinux := filepath.Join(filepath.Dir(filepath.Dir(k.image)), "pvh-vmlinux")
	if hasPVHEntry(vmlinux) {
		return vmlinux
	}
	img, err := os.ReadFile(k.image)
	if err != nil {
		return ""
	}
	for _, c := range []struct {
		magic string
		cmd   []string
	}{
		{"\xfd7zXZ\x00", []string{"xz", "-dc", "--single-stream"}},
		{"\x28\xb5\x2f\xfd", []string{"zstd", "-dcq"}},
		{"\x1f\x8b\x08\x00", []string{"gzip", "-dcq"}},
	} {
		i := bytes.Index(img, []byte(c.magic))
		if i < 0 {
			continue
		}
		cmd := exec.Command(c.cmd[0], c.cmd[1:]...)
		cmd.Stdin = bytes.NewReader(img[i:])
		out, _ := cmd.Output() // trailing data after the payload makes some tools complain
		if len(out) == 0 {
			continue
		}
		tmp := vmlinux + ".tmp"
		if os.WriteFile(tmp, out, 0o644) == nil && hasPVHEntry(tmp) && os.Rename(tmp, vmlinux) == nil {
			return vmlinux
		}
		os.Remove(tmp)
	}
	return ""
}

// hasPVHEntry reports whether p is an ELF file with the Xen note that gives a PVH entry point
// (XEN_ELFNOTE_PHYS32_ENTRY, type 18).
func hasPVHEntry(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(prog.Open())
		if err != nil {
			return false
		}
		// each note: namesz, descsz, type (4 bytes each), name and desc padded to 4
		for len(notes) >= 12 {
			namesz := int(f.ByteOrder.Uint32(notes[0:]))
			descsz := int(f.ByteOrder.Uint32(notes[4:]))
			typ := f.ByteOrder.Uint32(notes[8:])
			name := notes[12:]
			pad := func(n int) int { return (n + 3) &^ 3 }
			if len(name) < pad(namesz)+pad(descsz) {
				break
			}
			if typ == 18 && string(bytes.TrimRight(name[:namesz], "\x00")) == "Xen" {
				return true
			}
			notes = name[pad(namesz)+pad(descsz):]
		}
	}
	return false
}

// moduleName is the kernel's name for a module file (nbd.ko.xz -> nbd, crc32c-intel.ko ->
// crc32c_intel) and whether file is a module at all.
func moduleName(file string) (string, bool) {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if strings.HasSuffix(file, ext) {
			return strings.ReplaceAll(strings.TrimSuffix(file, ext), "-", "_"), true
		}
	}
	return "", false
}

// moduleBytes returns module name's object, decompressed on the host (busybox insmod loads
// plain .ko files only).
func (k *kernel) moduleBytes(name string) ([]byte, error) {
	p, ok := k.modules[name]
	if !ok {
		return nil, fmt.Errorf("kernel %s has no module %s", k.version, name)
	}
	var tool string
	switch {
	case strings.HasSuffix(p, ".ko"):
		return os.ReadFile(p)
	case strings.HasSuffix(p, ".gz"):
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(p, ".xz"):
		tool = "xz"
	default:
		tool = "zstd"
	}
	out, err := exec.Command(tool, "-dc", p).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc %s: %w", tool, p, err)
	}
	return out, nil
}

// moduleDeps reads the modules a module needs loaded first: the depends= entry of the object's
// .modinfo section (what depmod reads; the package ships no modules.dep, depmod makes it at
// install time).
func moduleDeps(object []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(object))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	info, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// loadedModule is a module the guest loads, with the object to insmod.
type loadedModule struct {
	name   string
	object []byte
}

// loadOrder returns the modules to insmod for names, each after the modules it depends on and
// each once; modules built into the kernel are left out (their parameters go on the command
// line, see moduleArgs).
func (k *kernel) loadOrder(names []string) ([]loadedModule, error) {
	var order []loadedModule
	seen := map[string]bool{}
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		if seen[name] || k.builtin[name] {
			return nil
		}
		for _, c := range chain {
			if c == name {
				return fmt.Errorf("module dependency cycle: %s", strings.Join(append(chain, name), " -> "))
			}
		}
		obj, err := k.moduleBytes(name)
		if err != nil {
			return err
		}
		deps, err := moduleDeps(obj)
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		seen[name] = true
		order = append(order, loadedModule{name: name, object: obj})
		return nil
	}
	for _, n := range names {
		if err := visit(strings.ReplaceAll(n, "-", "_"), nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
