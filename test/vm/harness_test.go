package vm

import (
	"strings"
	"testing"
)

// TestHarness boots the guest with a script that prints and exits 3: the harness must return
// that status and the output, and the initramfs must carry the real tools (not busybox applets)
// and a raid5d that runs.
func TestHarness(t *testing.T) {
	res := runVM(t, vmRun{script: `
echo "hello from $(uname -r)"
for tool in nbd-client mdadm fio mkfs.ext4 e2fsck blkdiscard fstrim; do
	"$tool" --version >/dev/null 2>&1 || "$tool" -V >/dev/null 2>&1 || "$tool" -h >/dev/null 2>&1 || die "$tool does not run"
	[ ! -L "$(command -v "$tool")" ] || die "$tool is a link (a busybox applet?)"
done
raid5d --version
exit 3
`})
	if res.status != 3 {
		t.Fatalf("exit status %d, want 3; console:\n%s", res.status, res.output)
	}
	if want := "hello from " + env.kernel.version; !strings.Contains(res.output, want) {
		t.Fatalf("console lacks %q:\n%s", want, res.output)
	}
}
