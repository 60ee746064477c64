package vm

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
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

// TestHostServer runs raid5d on the host, on member files, and guest/host.sh attaches the
// guest's kernel client to it with -C 2 through the restricted user network's one forward (a
// command per connection, so both connections reach raid5d): ext4, checksums, fstrim, e2fsck -fn.
// The host checks that the trims arrived (metrics) and that raid5d stops cleanly.
func TestHostServer(t *testing.T) {
	needGuest(t, "nbd-client", "mkfs.ext4", "e2fsck", "fstrim")
	dir := t.TempDir()
	var members []string
	for i := range 4 {
		members = append(members, filepath.Join(dir, fmt.Sprintf("m%d.img", i)))
	}
	if out, err := exec.Command(env.raid5d, append([]string{"create", "--size", "64M"}, members...)...).CombinedOutput(); err != nil {
		t.Fatalf("raid5d create: %v\n%s", err, out)
	}
	port, metricsPort := freePort(t), freePort(t)
	var log bytes.Buffer
	serve := exec.Command(env.raid5d, append([]string{"serve", "--listen", "127.0.0.1:" + port,
		"--control", filepath.Join(dir, "control.sock"), "--metrics", "127.0.0.1:" + metricsPort}, members...)...)
	serve.Stdout, serve.Stderr = &log, &log
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			serve.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("raid5d serve output:\n%s", log.String())
		}
	})
	metrics := func() string {
		resp, err := http.Get("http://127.0.0.1:" + metricsPort + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	deadline := time.Now().Add(time.Minute)
	for metrics() == "" {
		if time.Now().After(deadline) {
			t.Fatal("raid5d serve did not answer on its metrics address within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}

	mustPass(t, runVM(t, vmRun{script: guestScript(t, "host.sh"), net: true, forward: port,
		timeout: 5 * time.Minute, modules: []string{"nbd", "e1000", "ext4", "crc32c_generic"}}))

	m := regexp.MustCompile(`(?m)^raid5d_requests_total\{cmd="trim"\} (\S+)$`).FindStringSubmatch(metrics())
	if m == nil || m[1] == "0" {
		t.Errorf("raid5d on the host counted no trims after the guest's fstrim (%v)", m)
	}
	serve.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("raid5d serve exited after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("raid5d serve did not exit within a minute of SIGTERM")
	}
}

// TestGuestNetRestricted checks that the guest's network reaches the host only through the
// forward: the host listens on two loopback ports, the forwarded one answers a greeting, and the
// guest must read it through $FWD_ADDR:$FWD_PORT but fail, within a minute each, to reach the
// other one through 10.0.2.2 (qemu's user network without restrict=on turns that into the host's
// 127.0.0.1) or through the forward's address; the other listener must have accepted nothing.
func TestGuestNetRestricted(t *testing.T) {
	needVM(t)
	listen := func() (net.Listener, *atomic.Int32) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		var accepted atomic.Int32
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.SetWriteDeadline(time.Now().Add(time.Minute))
				io.WriteString(c, "forwarded\n")
				c.Close()
			}
		}()
		return l, &accepted
	}
	fwd, fwdAccepted := listen()
	other, otherAccepted := listen()
	otherPort := strconv.Itoa(other.Addr().(*net.TCPAddr).Port)
	mustPass(t, runVM(t, vmRun{net: true, forward: strconv.Itoa(fwd.Addr().(*net.TCPAddr).Port),
		modules: []string{"e1000"}, env: map[string]string{"OTHER_PORT": otherPort}, script: `
net_up
got=$(timeout 60 nc "$FWD_ADDR" "$FWD_PORT" </dev/null) || die "nc $FWD_ADDR $FWD_PORT (the forward) exited $?"
[ "$got" = forwarded ] || die "the forward answered '$got', want 'forwarded'"
log "the forward reaches the host"
for dst in 10.0.2.2 "$FWD_ADDR"; do
	got=$(timeout 60 nc "$dst" "$OTHER_PORT" </dev/null) &&
		die "the guest reached the host's unforwarded 127.0.0.1:$OTHER_PORT through $dst:$OTHER_PORT ('$got')"
	log "$dst:$OTHER_PORT unreachable (nc exited $?)"
done
log "passed"
`}))
	if n := otherAccepted.Load(); n != 0 {
		t.Errorf("the unforwarded listener on 127.0.0.1:%s accepted %d connections from the guest", otherPort, n)
	}
	if n := fwdAccepted.Load(); n != 1 {
		t.Errorf("the forwarded listener accepted %d connections, want 1", n)
	}
}

// freePort returns a TCP port on loopback that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
