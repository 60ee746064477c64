package member

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Exclusive use of members (package doc # Exclusive use). A member, spare or journal opened for use
// holds a flock(2) lock on its open file description: exclusive when read-write, shared when
// read-only, so that read-only assemblies may share members but not with a writer. flock, not
// fcntl locks: POSIX record locks belong to the process and are dropped when any descriptor of
// the file is closed (an Examine of a member in the daemon would release the daemon's lock),
// and they never conflict within one process; OFD locks behave like flock but the kernel hides
// their owner (F_OFD_GETLK and /proc/locks say pid -1), and the error must name the holder.
// /proc/locks lists each flock with the pid that took it, which BusyError reports. A block
// device opened read-write is also opened with O_EXCL, the kernel's exclusive claim that md and
// mkfs use: it fails while the device is mounted, part of md or dm, or so opened elsewhere.

// Use says how a member is opened and locked (Open, OpenFile). A kind whose members have no
// lock (a remote export) opens read-write for Exclusive and read-only otherwise.
type Use int

const (
	// Exclusive: read-write, flock LOCK_EX, and O_EXCL on a block device.
	Exclusive Use = iota
	// Shared: read-only, flock LOCK_SH (a read-only assembly).
	Shared
	// Inspect: read-only, no lock: Examine reads the superblocks of members in use.
	Inspect
)

// blockLockTries bounds the attempts at a block device's lock, 50 ms apart: udev takes a shared
// flock on a block device for a moment while it probes it (after losetup, say), which must not
// make raid5d refuse the device. A file's lock is tried once.
const blockLockTries = 20

// Holder is a process that holds a member's lock.
type Holder struct {
	PID     int
	Command string // its command name (/proc/PID/comm), "" if unknown
}

// BusyError is the error for a member in use: errors.Is(err, ErrBusy). It names the
// holders where they can be found.
type BusyError struct {
	Path string
	// Holders are the processes holding a flock on Path, from /proc/locks; empty if none could
	// be found (a holder in another pid namespace, or one that has just let go).
	Holders []Holder
	// Claimed says that the kernel refused a block device's exclusive open (EBUSY); Claim then
	// says by what, where that could be found ("mounted on /mnt", "held by md0"), else "".
	Claimed bool
	Claim   string
}

func (e *BusyError) Error() string {
	s := ErrBusy.Error() + ": " + e.Path
	if e.Claimed {
		s += ": the kernel holds it for exclusive use"
		if e.Claim != "" {
			s += " (" + e.Claim + ")"
		} else if len(e.Holders) == 0 {
			s += " (mounted, part of md or dm, or open with O_EXCL by another program)"
		}
	}
	if len(e.Holders) > 0 {
		var hs []string
		for _, h := range e.Holders {
			d := "pid " + strconv.Itoa(h.PID)
			var notes []string
			if h.Command != "" {
				notes = append(notes, h.Command)
			}
			if h.PID == os.Getpid() {
				notes = append(notes, "this process")
			}
			if len(notes) > 0 {
				d += " (" + strings.Join(notes, ", ") + ")"
			}
			hs = append(hs, d)
		}
		s += ": locked by " + strings.Join(hs, ", ")
	} else if !e.Claimed {
		s += ": locked by another process (not found in /proc/locks)"
	}
	return s
}

func (e *BusyError) Unwrap() error { return ErrBusy }

// openUse opens the file or block device at path for use (see Use), with O_DIRECT if direct.
// A lock or an exclusive claim held elsewhere is a *BusyError.
func openUse(path string, use Use, direct bool) (*os.File, error) {
	flag := os.O_RDONLY | unix.O_CLOEXEC
	if direct {
		flag |= unix.O_DIRECT
	}
	block := false
	if use == Exclusive {
		flag = os.O_RDWR | unix.O_CLOEXEC | flag&unix.O_DIRECT
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			block, flag = true, flag|unix.O_EXCL
		}
	}
	f, err := openFunc(path, flag, 0)
	if err != nil {
		if block && errors.Is(err, unix.EBUSY) {
			return nil, claimedError(path)
		}
		return nil, err
	}
	if use == Inspect {
		return f, nil
	}
	how := unix.LOCK_EX
	if use == Shared {
		how = unix.LOCK_SH
	}
	if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeDevice != 0 {
		block = true
	}
	for try := 1; ; try++ {
		err := retryEINTR(func() error { return unix.Flock(int(f.Fd()), how|unix.LOCK_NB) })
		if err == nil {
			return f, nil
		}
		if err != unix.EWOULDBLOCK || !block || try == blockLockTries {
			f.Close()
			if err == unix.EWOULDBLOCK {
				return nil, &BusyError{Path: path, Holders: lockHolders(path)}
			}
			return nil, &os.PathError{Op: "flock", Path: path, Err: err}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openFunc is os.OpenFile; tests replace it to refuse O_DIRECT as some file systems do.
var openFunc = os.OpenFile

// claimedError describes a block device whose exclusive open failed with EBUSY: raid5d's lock
// holders, if another raid5d has it, else its holders in sysfs (md, dm) or its mount point.
func claimedError(path string) *BusyError {
	e := &BusyError{Path: path, Claimed: true, Holders: lockHolders(path)}
	var st unix.Stat_t
	if len(e.Holders) > 0 || unix.Stat(path, &st) != nil {
		return e
	}
	majMin := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if ents, err := os.ReadDir("/sys/dev/block/" + majMin + "/holders"); err == nil && len(ents) > 0 {
		var names []string
		for _, d := range ents {
			names = append(names, d.Name())
		}
		e.Claim = "held by " + strings.Join(names, ", ")
		return e
	}
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.Lines(string(data)) {
			// 42 27 7:0 / /mnt rw,relatime - ext4 /dev/loop0 rw
			if f := strings.Fields(line); len(f) >= 5 && f[2] == majMin {
				e.Claim = "mounted on " + f[4]
				return e
			}
		}
	}
	return e
}

// lockHolders returns the processes that hold a flock on the file at path, from /proc/locks
// (whose lines read "1: FLOCK  ADVISORY  WRITE 6670 fe:00:9978408 0 EOF": pid, then the
// filesystem's device in hex and the inode; waiters have "->" after the number).
func lockHolders(path string) []Holder {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return nil
	}
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	var hs []Holder
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || pid <= 0 || slices.ContainsFunc(hs, func(h Holder) bool { return h.PID == pid }) {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + f[4] + "/comm")
		hs = append(hs, Holder{PID: pid, Command: strings.TrimSpace(string(comm))})
	}
	return hs
}
