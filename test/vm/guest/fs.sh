# An ext4 filesystem on raid5d through the kernel's nbd client, over TCP with one and with two
# connections and over a unix socket: mkfs, mount, files, sync, drop caches, checksums,
# remount, fstrim and blkdiscard reaching raid5d as TRIM, e2fsck -fn clean, nbd-client -d,
# and a kernel log without nbd errors.

ZERO16M=$(dd if=/dev/zero bs=1M count=16 2>/dev/null | sha256sum)
for mode in tcp tcp-C2 unix; do
	log "== $mode"
	create
	case $mode in
	tcp) serve; attach ;;
	tcp-C2) serve; attach -C 2 ;;
	unix) serve --socket "$SOCK"; attach -u "$SOCK" ;;
	esac
	[ "$(cat /sys/block/nbd0/queue/discard_max_bytes)" -gt 0 ] || die "$NBD takes no discards: raid5d did not offer TRIM"

	mkfs.ext4 -q -F -E nodiscard "$NBD" || die "mkfs.ext4"
	mkdir -p "$MNT"
	mount -t ext4 "$NBD" "$MNT" || die "mount"
	write_files "$MNT/small" 200 4
	write_files "$MNT/big" 4 8192
	drop_caches
	check_files "$MNT/small"
	check_files "$MNT/big"
	umount "$MNT"
	mount -t ext4 "$NBD" "$MNT" || die "remount"
	check_files "$MNT/small"
	check_files "$MNT/big"

	rm -r "$MNT/big"
	sync
	before=$(metric raid5d_requests_total 'cmd="trim"')
	fstrim -v "$MNT" || die "fstrim"
	after=$(metric raid5d_requests_total 'cmd="trim"')
	log "fstrim: raid5d trims $before -> $after, $(metric raid5d_request_bytes_total 'cmd="trim"') bytes"
	[ "$after" -gt "$before" ] || die "fstrim sent no TRIM to raid5d ($before -> $after)"
	check_files "$MNT/small"
	umount "$MNT"
	fsck_clean

	# raid5d's TRIM makes the range read as zeroes: data there, discarded, must read back as
	# zeroes from the device (a TRIM the array ignored would leave the data)
	dd if=/dev/urandom of="$NBD" bs=1M seek=32 count=16 conv=fsync 2>/dev/null
	drop_caches
	[ "$(dd if="$NBD" bs=1M skip=32 count=16 2>/dev/null | sha256sum)" != "$ZERO16M" ] || die "random data read as zeroes"
	before=$after
	blkdiscard -f -o 33554432 -l 16777216 "$NBD" || die "blkdiscard"
	after=$(metric raid5d_requests_total 'cmd="trim"')
	log "blkdiscard 16 MiB: raid5d trims $before -> $after"
	[ "$after" -gt "$before" ] || die "blkdiscard sent no TRIM to raid5d"
	drop_caches
	[ "$(dd if="$NBD" bs=1M skip=32 count=16 2>/dev/null | sha256sum)" = "$ZERO16M" ] || die "16 MiB discarded by blkdiscard do not read as zeroes"

	detach
	raid5d status | grep -q 'clean\|active' || die "status after detach"
	stop_daemon
	dmesg_clean
done
log "all modes passed"
