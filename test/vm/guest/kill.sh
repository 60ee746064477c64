# SIGKILL of raid5d under a mounted filesystem's writes, as a power cut: the members are
# volatile: specs, so whatever raid5d had not flushed when it died is lost. Files synced before
# the kill must come back intact after a restart and reattach, and the filesystem must mount
# (replaying its journal) and check clean. First the same on the raw device, where fsync sends
# the kernel's FLUSH alone (ext4 also writes its commits with FUA): a FLUSH that does not make
# the members durable fails there.

dmesg -n 1 # the I/O errors after the kill go to the log, not the console
create
vol=""
for m in $MEMBERS; do vol="$vol volatile:$m"; done
SERVE_MEMBERS=$vol serve
attach
dd if=/dev/urandom of=/tmp/raw bs=1M count=8 2>/dev/null
dd if=/tmp/raw of="$NBD" bs=1M seek=40 conv=fsync 2>/dev/null || die "dd to $NBD"
kill_daemon
detach
SERVE_MEMBERS=$vol serve
attach
drop_caches
[ "$(dd if="$NBD" bs=1M skip=40 count=8 2>/dev/null | sha256sum)" = "$(sha256sum </tmp/raw)" ] ||
	die "8 MiB written and fsynced on $NBD (FLUSH) did not survive SIGKILL"
log "raw: fsynced data intact after SIGKILL"

mkfs.ext4 -q -F -E nodiscard "$NBD" || die "mkfs.ext4"
mkdir -p "$MNT"
mount -t ext4 "$NBD" "$MNT" || die "mount"
write_files "$MNT/synced" 100 4
write_files "$MNT/synced-big" 2 4096
sync
log "synced; writing more in the background, then SIGKILL"
mkdir -p "$MNT/unsynced"
rm -f /tmp/stop-writer
(
	i=0
	while [ ! -e /tmp/stop-writer ]; do
		dd if=/dev/urandom of="$MNT/unsynced/f$i" bs=64k count=16 2>/dev/null &
		echo $! >/tmp/writer-dd.pid
		wait $! || break
		i=$((i + 1))
	done
) &
writer=$!
sleep 3
kill_daemon
log "raid5d killed"
touch /tmp/stop-writer
# The kernel client (no -t) never times out a request: one in flight when the server died waits
# for ever, and umount with it. nbd-client -d fails it and everything queued, as a user would;
# the device is released once the filesystem lets go of it.
nbd-client -d "$NBD" >/dev/null
kill -KILL "$(cat /tmp/writer-dd.pid)" 2>/dev/null || true
wait "$writer" 2>/dev/null || true
log "disconnected, writer stopped"
umount "$MNT" || die "umount after the kill and nbd-client -d"
wait_for 30 "$NBD to be released" sh -c "[ \$(cat /sys/block/nbd0/size) = 0 ]"
log "unmounted, released"

serve
log "restarted: $(raid5d status | head -n 3 | tr '\n' ' ')"
attach
mount -t ext4 "$NBD" "$MNT" || die "mount after the kill (journal replay)"
check_files "$MNT/synced"
check_files "$MNT/synced-big"
log "synced files intact; $(ls "$MNT/unsynced" 2>/dev/null | wc -l) unsynced files present"
umount "$MNT"
fsck_clean
detach
stop_daemon
dmesg_sane
log "passed"
