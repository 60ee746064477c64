// Package vm tests raid5d through the kernel's own NBD client, in a virtual machine: the host's
// kernel here has no nbd (or md) module, so the tests boot a stock Debian kernel under
// qemu-system-x86_64 with a small initramfs and run a shell script in it.
//
// There is no code here outside the _test.go files; this file only documents the package.
//
// # The guest
//
// The kernel is the Debian package linux-image-amd64 depends on, fetched with apt-get download
// and unpacked with dpkg-deb -x into test/vm/.cache (ignored by git); it is booted as a plain
// vmlinux at its PVH entry point, extracted once from the compressed image (decompressing in the
// guest took most of the boot under TCG). The initramfs is written by the test itself (newc cpio,
// cpio_test.go): busybox-static, dash as the scripts' shell (busybox's sh would run its own
// blkdiscard and fstrim rather than util-linux's), the real tools with the shared libraries ldd
// names (nbd-client, mdadm, fio, mkfs.ext4, e2fsck, blkdiscard, fstrim, nbdkit and its file
// plugin), a static raid5d (CGO_ENABLED=0) and the kernel modules a run asks for, with their
// dependencies read from each module's .modinfo (decompressed on the host). A run's own files
// (its script, guest/lib.sh, its modules) are a second archive appended to the shared one.
//
// /init loads the modules, runs the script under dash with guest/lib.sh (set -eu, helpers that
// bound every wait), prints RAID5D-VM-EXIT=<status> on the serial console and powers off; the
// harness reads the console from qemu's stdout and kills qemu after the run's timeout.
//
// Every nbd-client attach goes through lib.sh's nbd_connect, which waits for a receive worker
// per connection and attaches again while the kernel's nbd driver has left one without (its
// recv workqueue's rescuer runs them one after the other under load; lib.sh says more); each
// retry prints a "vm: KERNEL:" line, which runVM logs even when the test passes.
//
// qemu runs with TCG (-accel tcg,thread=multi -cpu max): some hosts offer /dev/kvm but only
// run specially built guest kernels. KVM is used only where a probe boot of the stock kernel
// under it succeeds; the result is remembered per host and guest kernel in the cache.
//
// # Environment
//
//   - RAID5D_REQUIRE_TOOLS=1 (CI) turns "no qemu / no kernel / a tool missing" skips into
//     failures.
//   - RAID5D_VM_ACCEL=tcg|kvm|auto forces the accelerator (default auto, see above).
//   - RAID5D_VM_CACHE=DIR keeps the kernel elsewhere; RAID5D_VM_KERNEL_PKG=linux-image-...
//     boots another kernel package.
//   - RAID5D_VM_CONSOLE=1 copies the guest's console to stderr as it comes.
//   - RAID5D_VM_BENCH=1 runs TestBench (make bench-vm): md RAID-5, raid5d and md+nbdkit side
//     by side in one boot; and TestBenchRemote (make bench-vm-remote): md RAID-5 over
//     nbd-client devices against raid5d with nbd+unix:// members, the same four nbdkit servers.
//     ROUNDS, RUNTIME, SIZE, CONFIGS and JOBS (the fio jobs by name) pass through to the
//     scripts (guest/bench.sh, guest/bench-remote.sh say what they mean), and so does
//     STALL_SECS (bench-remote.sh: a device with requests in flight and none completed for
//     that long gets lib.sh's stall_report: the driver's in-flight list, the servers' and the
//     driver's kernel stacks, the blocked tasks).
//   - RAID5D_VM_B=FILE puts a second static raid5d (CGO_ENABLED=0 go build of another commit)
//     in the guest as raid5d-b, which bench.sh's config raid5d-b serves: a before/after in one
//     boot, e.g. CONFIGS="raid5d-b raid5d md+nbdkit".
//   - RAID5D_VM_PROFILE=DIR runs TestProfile (make profile-vm): the servers' CPU and system
//     calls per request behind the kernel client, raid5d's counter deltas per job and its CPU
//     profiles, written to DIR; RUNTIME, SIZE, SPECS, JOBS, SERVE_FLAGS, QUEUE and TRACE
//     (1: the requests the client issued, from the block_rq_issue tracepoint) pass through
//     (guest/profile.sh).
//   - RAID5D_VM_APPEND adds to the guest kernel's command line, e.g. "clocksource=tsc
//     tsc=reliable" (under TCG the kernel picks hpet, and every clock read is a system call).
//
// # Time
//
// A boot to the script takes about 8 s under TCG on a quiet 2-core machine; the functional
// tests (make test runs them) take a few minutes together, each boot bounded by its timeout.
package vm
