# A member failed, then removed, under a mounted filesystem: the filesystem keeps working
# (reads rebuilt from parity, new writes), checks clean; a fifth RAM disk added as a spare is
# rebuilt onto, after which scrub finds parity consistent. The kernel logs no errors.

MEMBERS="/dev/ram0 /dev/ram1 /dev/ram2 /dev/ram3"
create
serve
attach
mkfs.ext4 -q -F "$NBD" || die "mkfs.ext4"
mkdir -p "$MNT"
mount -t ext4 "$NBD" "$MNT" || die "mount"
write_files "$MNT/a" 100 4
write_files "$MNT/a-big" 2 4096
sync

raid5d fail 2 || die "raid5d fail 2"
rc=0; raid5d status >/tmp/status || rc=$?
[ $rc = 3 ] || { cat /tmp/status; die "status exit $rc after fail, want 3 (degraded)"; }
log "member 2 failed: $(grep -i state /tmp/status | head -n 1)"
drop_caches
check_files "$MNT/a"
check_files "$MNT/a-big"
write_files "$MNT/b" 50 16
sync
drop_caches
check_files "$MNT/a"
check_files "$MNT/b"

raid5d remove 2 || die "raid5d remove 2"
write_files "$MNT/c" 2 4096
sync
umount "$MNT"
fsck_clean
mount -t ext4 "$NBD" "$MNT" || die "remount degraded"
check_files "$MNT/a"
check_files "$MNT/b"
check_files "$MNT/c"

raid5d add /dev/ram4 || die "raid5d add /dev/ram4"
wait_for 120 "the rebuild onto /dev/ram4 to finish" raid5d status
log "rebuilt: $(raid5d status | grep -i state | head -n 1)"
raid5d scrub check --wait || die "scrub check after the rebuild exited $?"
drop_caches
check_files "$MNT/a"
check_files "$MNT/c"
umount "$MNT"
fsck_clean
detach
stop_daemon
dmesg_clean
log "passed"
