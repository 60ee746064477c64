# Side by side on the same four RAM disks, in one boot, alternating rounds: Linux md RAID-5
# (16 KiB chunks, --assume-clean) with and without skip_copy, raid5d (16 KiB chunks) through the
# kernel's nbd client, and md exported by nbdkit's file plugin through the same client, both
# over a unix socket (md+nbdkit-nc: nbdkit with cache=none, md's work done as each request is
# served, not deferred to the page cache's writeback); and
# raid5d+msk, raid5d with the nbd device's max_sectors_kb raised from the kernel's 128 to 1024,
# so that 1 MiB requests reach the server whole; raid5d+nm, with the nbd device's nomerges 2
# (the client's queue does not merge adjacent requests); raid5d-pc, raid5d with the RAM disks
# through the page cache (--direct off; block devices are opened O_DIRECT by default); raid5d-nb,
# raid5d created with --consistency none (no write-intent bitmap, as md has none at this size);
# raid5d-rSIZE (e.g. raid5d-r64m), raid5d created with --bitmap-region SIZE (64M: mdadm's
# default bitmap chunk); raid5d-b, raid5d as the second binary (make bench-vm RAID5D_VM_B=a
# static raid5d build of another commit: a before/after in one boot). fio with
# libaio and O_DIRECT, each job time-bounded. Prints one RESULT line per round, config and
# workload: RESULT ROUND CONFIG WORKLOAD KIB_PER_S IOPS.
#
# Environment: ROUNDS (3), RUNTIME (seconds per job, 5), SIZE (MiB of the device the jobs
# use, 256), CONFIGS (the configs, in round 1's order; later rounds alternate the order), JOBS
# (the workloads' names, of lib.sh's WORKLOADS; all by default).

ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-5}
SIZE=${SIZE:-256}
CONFIGS=${CONFIGS:-md md-skip_copy md+nbdkit md+nbdkit-nc raid5d raid5d+msk raid5d-pc}
NBDKIT_SOCK=/run/nbdkit.sock
MD=/dev/md0


md_up() {
	[ -e /sys/block/md0/md ] && return 0
	mdadm --create "$MD" --run --force --assume-clean --level=5 --raid-devices=4 --chunk=16 \
		--metadata=1.2 $MEMBERS >/tmp/mdadm.out 2>&1 || { cat /tmp/mdadm.out; die "mdadm --create"; }
	wait_for 30 "$MD" test -b "$MD"
}

md_down() {
	[ -e /sys/block/md0/md ] || return 0
	mdadm --stop "$MD" >/dev/null 2>&1 || die "mdadm --stop"
	mdadm --zero-superblock $MEMBERS >/dev/null 2>&1 || true
}

# setup CONFIG: makes the device of a config and prints its path.
setup() {
	case $1 in
	md | md-skip_copy)
		md_up
		if [ "$1" = md ]; then echo 0 >/sys/block/md0/md/skip_copy; else echo 1 >/sys/block/md0/md/skip_copy; fi
		DEV=$MD
		;;
	md+nbdkit | md+nbdkit-nc)
		# md+nbdkit-nc: nbdkit's cache=none, so that md does each write's parity work when
		# the write is served, as raid5d does, instead of in the page cache's writeback later,
		# and reads reach md instead of the page cache
		md_up
		echo 0 >/sys/block/md0/md/skip_copy
		rm -f "$NBDKIT_SOCK"
		cache=default
		[ "$1" != md+nbdkit-nc ] || cache=none
		nbdkit --unix "$NBDKIT_SOCK" --pidfile /run/nbdkit.pid file file="$MD" cache=$cache || die "nbdkit"
		wait_for 30 "nbdkit's socket" test -S "$NBDKIT_SOCK"
		nbd_connect "$NBD" -u "$NBDKIT_SOCK" "$NBD" -b 4096
		DEV=$NBD
		;;
	raid5d | raid5d+msk | raid5d+nm | raid5d-pc | raid5d-nb | raid5d-r* | raid5d-b)
		# raid5d-pc: the RAM disks through the page cache (--direct off) instead of O_DIRECT
		# (the default for block devices), so whole-stripe writes can be placed.
		md_down
		RAID5D_BIN=raid5d
		[ "$1" != raid5d-b ] || RAID5D_BIN=raid5d-b
		case $1 in
		raid5d-nb) create --chunk 16K --consistency none ;;
		raid5d-r*) create --chunk 16K --bitmap-region "${1#raid5d-r}" ;;
		*) create --chunk 16K ;;
		esac
		# over a unix socket, as nbdkit
		if [ "$1" = raid5d-pc ]; then serve --socket "$SOCK" --direct off >/dev/null; else serve --socket "$SOCK" >/dev/null; fi
		attach -u "$SOCK" >/dev/null
		[ "$1" != raid5d+msk ] || echo 1024 >/sys/block/nbd0/queue/max_sectors_kb
		# raid5d+nm: no merging of adjacent requests in the client's queue, so that 48 KiB
		# writes reach raid5d as the full stripes they are, not merged into 96-128 KiB ones
		[ "$1" != raid5d+nm ] || echo 2 >/sys/block/nbd0/queue/nomerges
		DEV=$NBD
		;;
	*) die "unknown config $1" ;;
	esac
}

teardown() {
	case $1 in
	md+nbdkit | md+nbdkit-nc)
		detach
		kill "$(cat /run/nbdkit.pid)"
		wait_for 30 "nbdkit to exit" sh -c '! kill -0 $(cat /run/nbdkit.pid)'
		;;
	raid5d | raid5d+msk | raid5d+nm | raid5d-pc | raid5d-nb | raid5d-r* | raid5d-b)
		detach
		stop_daemon
		;;
	esac
}

# bitmap_flushes: raid5d's bitmap writes so far (each: the changed pages to every member, durably).
bitmap_flushes() {
	wget -q -O - "http://$METRICS/metrics" | awk '$1 == "raid5d_bitmap_flushes_total" { n = $2 } END { printf "%.0f\n", n }'
}

# before_job and after_job: raid5d's request counters around each job, the average request
# sizes and the flushes it saw logged in round 1
before_job() {
	case $1 in raid5d*)
		w0=$(metric raid5d_requests_total 'cmd="write"') b0=$(metric raid5d_request_bytes_total 'cmd="write"')
		r0=$(metric raid5d_requests_total 'cmd="read"') rb0=$(metric raid5d_request_bytes_total 'cmd="read"')
		f0=$(metric raid5d_requests_total 'cmd="flush"') bm0=$(bitmap_flushes) ;;
	esac
}

after_job() {
	case $1 in raid5d*)
		w1=$(metric raid5d_requests_total 'cmd="write"') b1=$(metric raid5d_request_bytes_total 'cmd="write"')
		r1=$(metric raid5d_requests_total 'cmd="read"') rb1=$(metric raid5d_request_bytes_total 'cmd="read"')
		f1=$(metric raid5d_requests_total 'cmd="flush"') bm1=$(bitmap_flushes)
		[ "$3" != 1 ] || log "$1 $2: requests at raid5d: $((w1 - w0)) writes of $(((b1 - b0) / ((w1 - w0) > 0 ? (w1 - w0) : 1) / 1024)) KiB average, $((r1 - r0)) reads of $(((rb1 - rb0) / ((r1 - r0) > 0 ? (r1 - r0) : 1) / 1024)) KiB, $((f1 - f0)) flushes, $((bm1 - bm0)) bitmap writes" ;;
	esac
}

log "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
log "bench: $ROUNDS rounds of $RUNTIME s jobs on $SIZE MiB; configs $CONFIGS; $(nproc) CPUs"
command -v xdd >/dev/null 2>&1 || log "xdd: not in the guest (not a Debian package); its experiment is skipped"
bench_rounds
dmesg_clean
log "bench done"
