# raid5d running on the host, the guest's kernel client attached with -C 2 (two connections)
# through the harness' one forward on qemu's restricted user network:
# ext4, files, checksums across drop_caches and a remount, fstrim, e2fsck -fn, nbd-client -d,
# a clean kernel log. The host side checks that the TRIMs arrived.

net_up
NBD_HOST=$FWD_ADDR PORT=$FWD_PORT
attach -C 2
mkfs.ext4 -q -F "$NBD" || die "mkfs.ext4"
mkdir -p "$MNT"
mount -t ext4 "$NBD" "$MNT" || die "mount"
write_files "$MNT/small" 100 4
write_files "$MNT/big" 2 8192
drop_caches
check_files "$MNT/small"
check_files "$MNT/big"
umount "$MNT"
mount -t ext4 "$NBD" "$MNT" || die "remount"
check_files "$MNT/small"
check_files "$MNT/big"
rm -r "$MNT/big"
fstrim -v "$MNT" || die "fstrim"
umount "$MNT"
fsck_clean
detach
dmesg_clean
log "passed"
