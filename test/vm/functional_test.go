package vm

import (
	"testing"
	"time"
)

// fsModules are the modules of a filesystem run: the NBD client, four 64 MiB RAM disks as the
// members, ext4 and the crc32c it checksums its metadata with.
var fsModules = []string{"nbd", "brd rd_nr=4 rd_size=65536", "ext4", "crc32c_generic"}

// TestFilesystem runs guest/fs.sh: ext4 on raid5d through the kernel's nbd client over TCP
// (one and two connections) and a unix socket; checksums across drop_caches and a remount,
// fstrim and blkdiscard counted by raid5d as TRIM, e2fsck -fn clean, a clean kernel log.
func TestFilesystem(t *testing.T) {
	needGuest(t, "nbd-client", "mkfs.ext4", "e2fsck", "blkdiscard", "fstrim")
	mustPass(t, runVM(t, vmRun{script: guestScript(t, "fs.sh"), modules: fsModules, timeout: 8 * time.Minute}))
}

// TestKill runs guest/kill.sh: raid5d on volatile: members SIGKILLed under a mounted
// filesystem's writes, restarted and reattached; synced files intact, e2fsck clean.
func TestKill(t *testing.T) {
	needGuest(t, "nbd-client", "mkfs.ext4", "e2fsck")
	mustPass(t, runVM(t, vmRun{script: guestScript(t, "kill.sh"), modules: fsModules, timeout: 5 * time.Minute}))
}

// TestDegraded runs guest/degraded.sh: raid5d fail, then remove, of a member under a mounted
// filesystem, which keeps working; add of a fifth RAM disk rebuilds; scrub and e2fsck clean.
func TestDegraded(t *testing.T) {
	needGuest(t, "nbd-client", "mkfs.ext4", "e2fsck")
	mustPass(t, runVM(t, vmRun{script: guestScript(t, "degraded.sh"),
		modules: []string{"nbd", "brd rd_nr=5 rd_size=65536", "ext4", "crc32c_generic"}, timeout: 6 * time.Minute}))
}
