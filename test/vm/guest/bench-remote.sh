# An array over four member servers, side by side in one boot, alternating rounds (make
# bench-vm-remote): four nbdkit file servers, one per unix socket, each on a file in a tmpfs (the
# member hosts); md-nbd is Linux md RAID-5 (16 KiB chunks, --assume-clean) over the kernel's
# nbd-client devices /dev/nbd0..3 attached to them, fio on /dev/md0; raid5d-nbd is raid5d with
# the same four servers as nbd+unix:// members, attached through nbd-client on /dev/nbd4, fio
# there. The -C2 configs give every kernel client two connections (md's members, raid5d's
# attach) and raid5d --member-conns 2; they are not run by default (time). They used to stall
# now and then in the kernel client, a freshly attached device left with a connection without
# a receiver; lib.sh's nbd_connect now attaches such a device again (README, "Through the
# kernel's nbd client, in a VM"). The jobs are lib.sh's WORKLOADS, as in bench.sh; one RESULT
# line per round, config and job (lib.sh's bench_rounds).
#
# A device with requests in flight and none completed for STALL_SECS (60) gets lib.sh's
# stall_report on the console (lines "vm: STALL:").
#
# Environment: ROUNDS (3), RUNTIME (seconds per job, 5), SIZE (MiB of the device the jobs
# use, 256), CONFIGS (the configs, in round 1's order; later rounds alternate the order), JOBS
# (lib.sh's WORKLOADS by name), STALL_SECS.

ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-256}
CONFIGS=${CONFIGS:-md-nbd raid5d-nbd}
MD=/dev/md0
SRV=/srv
NBD=/dev/nbd4 # raid5d's attach; md's members are /dev/nbd0..3
MEMBER_MIB=288 # each export: a quarter of the array plus room for raid5d's superblock and bitmap
# every kernel client's request timeout: long, so that a guest starved by a loaded host does
# not time requests out (the kernel's default, 30 s, was hit once here at load 12); md fails
# a member whose request fails
TIMEOUT=600

# the member hosts: nbdkit's file plugin on a file each, in RAM
mkdir -p "$SRV"
mount -t tmpfs -o size=$((4 * MEMBER_MIB + 64))m tmpfs "$SRV" || die "tmpfs"
URIS=""
for i in 0 1 2 3; do
	truncate -s "${MEMBER_MIB}M" "$SRV/m$i.img"
	nbdkit --unix "$SRV/m$i.sock" --pidfile "$SRV/m$i.pid" file file="$SRV/m$i.img" || die "nbdkit $i"
	wait_for 30 "nbdkit $i's socket" test -S "$SRV/m$i.sock"
	URIS="$URIS nbd+unix:///m$i?socket=$SRV/m$i.sock"
done
log "member servers: $(nbdkit --version) on $SRV/m0..3.sock, ${MEMBER_MIB} MiB files in a tmpfs"

# conns CONFIG: the connections of its kernel clients
conns() { case $1 in *-C2) echo 2 ;; *) echo 1 ;; esac; }

setup() {
	case $1 in
	md-nbd*)
		for i in 0 1 2 3; do
			nbd_connect /dev/nbd$i -u "$SRV/m$i.sock" /dev/nbd$i -b 4096 -t "$TIMEOUT" -C "$(conns "$1")"
		done
		mdadm --create "$MD" --run --force --assume-clean --level=5 --raid-devices=4 --chunk=16 \
			--metadata=1.2 /dev/nbd0 /dev/nbd1 /dev/nbd2 /dev/nbd3 >/tmp/mdadm.out 2>&1 ||
			{ cat /tmp/mdadm.out; die "mdadm --create"; }
		wait_for 30 "$MD" test -b "$MD"
		DEV=$MD
		;;
	raid5d-nbd*)
		raid5d create --force --chunk 16K $URIS >/dev/null || die "raid5d create on the servers"
		SERVE_MEMBERS=$URIS serve --member-conns "$(conns "$1")" >/dev/null
		attach -t "$TIMEOUT" -C "$(conns "$1")" >/dev/null
		DEV=$NBD
		;;
	*) die "unknown config $1" ;;
	esac
}

teardown() {
	case $1 in
	md-nbd*)
		mdadm --stop "$MD" >/dev/null 2>&1 || die "mdadm --stop"
		mdadm --zero-superblock /dev/nbd0 /dev/nbd1 /dev/nbd2 /dev/nbd3 >/dev/null 2>&1 || true
		for i in 0 1 2 3; do
			nbd-client -d /dev/nbd$i >/dev/null
			wait_for 30 "nbd$i to be released" sh -c "[ \$(cat /sys/block/nbd$i/size) = 0 ]"
		done
		;;
	raid5d-nbd*)
		detach
		stop_daemon
		;;
	esac
}

log "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
log "bench-remote: $ROUNDS rounds of $RUNTIME s jobs on $SIZE MiB; configs $CONFIGS; $(nproc) CPUs"
stall_watch "${STALL_SECS:-60}"
bench_rounds
stall_unwatch
for i in 0 1 2 3; do
	kill "$(cat "$SRV/m$i.pid")"
done
dmesg_clean
log "bench-remote done"
