# Shared helpers of the guest scripts, sourced by dash before each run's script. The run's
# modules are loaded (brd makes /dev/ram0..3, the members). Every wait here is bounded.
set -eu

MEMBERS="/dev/ram0 /dev/ram1 /dev/ram2 /dev/ram3"
PORT=10809
NBD_HOST=127.0.0.1 # the server attach connects to over TCP
SOCK=/run/raid5d.nbd
METRICS=127.0.0.1:9100
NBD=/dev/nbd0
MNT=/mnt/fs
RAID5D_LOG=/tmp/raid5d.log
RAID5D_PID=

# log prints a line marked as the script's, so it stands out among kernel messages.
log() { echo "vm: $*"; }

# die prints its arguments, the daemon's log and the kernel's recent messages, and exits 1.
die() {
	echo "vm: FAIL: $*"
	if [ -s "$RAID5D_LOG" ]; then
		echo "vm: --- raid5d log (last 40 lines)"
		tail -n 40 "$RAID5D_LOG"
	fi
	echo "vm: --- dmesg (last 30 lines)"
	dmesg | tail -n 30
	exit 1
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it succeeds; dies after SECONDS.
wait_for() {
	_secs=$1 _what=$2
	shift 2
	_n=$((_secs * 5))
	while ! "$@" >/dev/null 2>&1; do
		_n=$((_n - 1))
		[ "$_n" -gt 0 ] || die "waited ${_secs}s for $_what"
		sleep 0.2
	done
}

# create [FLAGS]: a new array on the four RAM disks (zeroed by create).
create() {
	${RAID5D_BIN:-raid5d} create --force "$@" $MEMBERS >/dev/null || die "raid5d create $* failed"
}

daemon_answers() {
	raid5d status >/dev/null 2>&1 || [ $? != 4 ]
}

# serve [FLAGS]: starts raid5d serve on the members ($SERVE_MEMBERS if set, e.g. volatile:
# specs) in the background (TCP on 127.0.0.1:$PORT, or the flags' --socket), with metrics on
# $METRICS, and waits until it answers its control socket and listens.
serve() {
	${RAID5D_BIN:-raid5d} serve --metrics "$METRICS" "$@" ${SERVE_MEMBERS:-$MEMBERS} >>"$RAID5D_LOG" 2>&1 &
	RAID5D_PID=$!
	wait_for 60 "raid5d to answer status" daemon_answers
	case " $* " in
	*" --socket "*) wait_for 30 "raid5d's socket" test -S "$SOCK" ;;
	*) wait_for 30 "raid5d to listen on $PORT" sh -c "netstat -ltn | grep -q ':$PORT '" ;;
	esac
	log "raid5d serving (pid $RAID5D_PID) $*"
}

# stop_daemon: SIGTERM, and the daemon must exit 0 within 60 s.
stop_daemon() {
	kill -TERM "$RAID5D_PID"
	_n=300
	while kill -0 "$RAID5D_PID" 2>/dev/null; do
		_n=$((_n - 1))
		[ "$_n" -gt 0 ] || die "raid5d did not exit within 60s of SIGTERM"
		sleep 0.2
	done
	wait "$RAID5D_PID" || die "raid5d exited $? after SIGTERM"
	RAID5D_PID=
}

# kill_daemon: SIGKILL, and wait for it to be gone.
kill_daemon() {
	kill -KILL "$RAID5D_PID"
	wait "$RAID5D_PID" 2>/dev/null || true
	RAID5D_PID=
}

# receivers DEV: how many tasks run the nbd driver's receive loop (recv_work) for DEV (nbd0):
# kworkers, whose comm is kworker/uN:M+DEV-recv while they run it, and the device's recv
# workqueue's rescuer thread, DEV-recv+DEV-recv while it runs it.
receivers() {
	_k=0
	for _s in $(grep -l recv_work /proc/[0-9]*/stack 2>/dev/null); do
		case $(cat "${_s%/stack}/comm" 2>/dev/null) in *"+$1-recv") _k=$((_k + 1)) ;; esac
	done
	echo $_k
}

# nbd_connect DEV NBD-CLIENT-ARGS...: runs nbd-client with the arguments (which name DEV) and
# waits until DEV has a size and, with -C 2 or more, a receiver for each of its connections.
#
# The kernel's nbd driver (drivers/block/nbd.c in Debian's 6.1, and in the upstream sources of
# 2023-24) runs each connection's receive loop as a work item on the device's recv workqueue,
# which is WQ_MEM_RECLAIM: when the kernel takes longer to create a kworker than the workqueue's mayday
# timeout (10 ms; a loaded host under TCG does), the workqueue's one rescuer thread takes the
# waiting items and runs them one after the other, and the first never returns while its
# connection lives. The other connection then has no receiver: the server answers the requests
# sent on it, the answers stay in its socket, and each request times out (-t, 30 s by default:
# "Connection timed out, retrying (2/2 alive)") and is resent on another connection, which also
# kills this one. A loop of attaches under load showed it in 7 of 16; CI saw it once as a 30 s
# request in TestHostServer. So a device short of receivers after 15 s, before anything has
# opened it (nothing sent, nothing lost), is detached and connected again, at most 4 more times,
# with a "vm: KERNEL:" line each time on stderr (the callers' stdout may go to /dev/null).
nbd_connect() {
	_dev=$1
	shift
	_conns=1 _prev=
	for _a in "$@"; do
		[ "$_prev" != -C ] || _conns=$_a
		_prev=$_a
	done
	_try=1
	while :; do
		nbd-client "$@" >/dev/null || die "nbd-client $*"
		wait_for 30 "$_dev to have a size" sh -c "[ \$(cat /sys/block/${_dev#/dev/}/size) -gt 0 ]"
		# one connection cannot be left without (the rescuer runs it); no stacks, no count
		[ "$_conns" -gt 1 ] && [ -r /proc/self/stack ] || return 0
		_end=$(($(date +%s) + 15))
		while _k=$(receivers "${_dev#/dev/}") && [ "$_k" -lt "$_conns" ] && [ "$(date +%s)" -lt "$_end" ]; do
			sleep 0.2
		done
		[ "$_k" -lt "$_conns" ] || return 0
		echo "vm: KERNEL: $_dev has $_k receive workers for its $_conns connections 15 s after nbd-client (attempt $_try): the nbd recv workqueue's rescuer runs them (lib.sh, nbd_connect); not the server's doing, detaching and connecting again" >&2
		[ "$_try" -lt 5 ] || die "$_dev short of receive workers after $_try attempts"
		nbd-client -d "$_dev" >/dev/null
		wait_for 30 "$_dev to be released" sh -c "[ \$(cat /sys/block/${_dev#/dev/}/size) = 0 ]"
		_try=$((_try + 1))
	done
}

# attach [NBD-CLIENT FLAGS]: the kernel client on $NBD, export raid5d, 4 KiB blocks; TCP unless
# the flags say -u SOCKET. Waits until the device has the array's size and its receivers
# (nbd_connect).
attach() {
	case " $* " in
	*" -u "*) nbd_connect "$NBD" "$@" -N raid5d -b 4096 "$NBD" ;;
	*) nbd_connect "$NBD" "$NBD_HOST" "$PORT" "$NBD" -N raid5d -b 4096 "$@" ;;
	esac
	log "attached $NBD ($*): $(blockdev --getsize64 "$NBD") bytes, max_sectors_kb $(cat /sys/block/${NBD#/dev/}/queue/max_sectors_kb)"
}

# net_up: the e1000 NIC on qemu's user network, restricted: the harness' forward, if the run
# asked for one, is $FWD_ADDR:$FWD_PORT; nothing else outside the guest answers.
net_up() {
	ip link set eth0 up || die "no eth0 (did the run ask for net and the e1000 module?)"
	ip addr add 10.0.2.15/24 dev eth0
	ip route add default via 10.0.2.2
}

# detach: nbd-client -d, and the device must be released (size 0).
detach() {
	nbd-client -d "$NBD" >/dev/null
	wait_for 30 "$NBD to be released" sh -c "[ \$(cat /sys/block/${NBD#/dev/}/size) = 0 ]"
}

# metric NAME LABELS: the value of one metric line, e.g. metric raid5d_requests_total 'cmd="trim"'.
metric() {
	wget -q -O - "http://$METRICS/metrics" | awk -v key="$1{$2}" '$1 == key { printf "%.0f\n", $2; found = 1 } END { if (!found) print 0 }'
}

# drop_caches: write back and forget the page cache, so reads go to the device.
drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

# sums_of DIR: where DIR's checksums are kept, outside the filesystem under test.
sums_of() { echo "/tmp/sums$(echo "$1" | tr / _)"; }

# write_files DIR N KIB: N files of random data of KIB KiB each; their checksums kept (sums_of).
write_files() {
	mkdir -p "$1"
	_i=0
	while [ $_i -lt "$2" ]; do
		dd if=/dev/urandom of="$1/f$_i" bs=1024 count="$3" 2>/dev/null
		_i=$((_i + 1))
	done
	(cd "$1" && sha256sum f*) >"$(sums_of "$1")"
}

# check_files DIR: every file written by write_files DIR still has its checksum.
check_files() {
	(cd "$1" && sha256sum -c -s "$(sums_of "$1")") || die "checksums of $1 differ"
}

# fsck_clean: e2fsck -fn finds nothing to fix on $NBD (unmounted).
fsck_clean() {
	e2fsck -fn "$NBD" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; die "e2fsck -fn $NBD exited $?"; }
	log "e2fsck -fn clean: $(tail -n 1 /tmp/fsck.out)"
}

# dmesg_sane: no kernel bug, oops or hung task (for runs where I/O errors are expected).
dmesg_sane() {
	if dmesg | grep -E 'BUG|Oops|hung_task|blocked for more than|Call Trace' >/tmp/dmesg.bad; then
		cat /tmp/dmesg.bad
		die "the kernel logged a bug or a hung task"
	fi
}

# dmesg_clean: the kernel logged no nbd, block-layer or ext4 errors or timeouts.
dmesg_clean() {
	if dmesg | grep -iE 'nbd.*(error|timed? ?out|dead|reset|unexpected)|I/O error|blk_update_request|EXT4-fs (error|warning)|Buffer I/O|critical' >/tmp/dmesg.bad; then
		cat /tmp/dmesg.bad
		die "the kernel logged errors"
	fi
}

# The benchmarks' fio jobs (bench.sh, bench-remote.sh), NAME:RW:BS:IODEPTH; $JOBS, if set,
# names the ones to run.
WORKLOADS=""
for _w in seqwrite-1M:write:1M:16 seqwrite-48k:write:48k:16 seqread-1M:read:1M:16 randwrite-4k:randwrite:4k:32 randread-4k:randread:4k:32; do
	case " ${JOBS:-${_w%%:*}} " in *" ${_w%%:*} "*) WORKLOADS="$WORKLOADS $_w" ;; esac
done

# fio_job NAME RW BS DEPTH DEV: one fio job, libaio and O_DIRECT on the first $SIZE MiB of DEV,
# $RUNTIME s after a second of ramp; prints KIB_PER_S IOPS. A write job ends with an fsync of
# DEV (end_fsync, a FLUSH through the nbd client), inside its timed run: what a server left in
# memory (nbdkit's page cache, raid5d's stripe cache) is written out in the job that wrote it,
# not in the next job's or config's time.
fio_job() {
	_sync=0
	case $2 in *write) _sync=1 ;; esac
	fio --name="$1" --filename="$5" --rw="$2" --bs="$3" --iodepth="$4" --ioengine=libaio --direct=1 \
		--size="${SIZE}M" --time_based --runtime="$RUNTIME" --ramp_time=1 --end_fsync=$_sync --minimal >/tmp/fio.out 2>&1 ||
		{ cat /tmp/fio.out; die "fio $1 on $5"; }
	case $2 in
	*write) awk -F';' '{ print $48, int($49) }' /tmp/fio.out ;;
	*) awk -F';' '{ print $7, int($8) }' /tmp/fio.out ;;
	esac
}

# fio_fill DEV: writes the first $SIZE MiB of DEV, so that reads find written data, and
# flushes it (end_fsync), so that the first job does not pay for its write-out.
fio_fill() {
	fio --name=fill --filename="$1" --rw=write --bs=1M --iodepth=8 --ioengine=libaio --direct=1 \
		--size="${SIZE}M" --end_fsync=1 >/dev/null 2>&1 || die "fio fill on $1"
}

# before_job and after_job CONFIG NAME ROUND run around each job of bench_rounds; a script may
# define its own.
before_job() { :; }
after_job() { :; }

# bench_rounds: $ROUNDS rounds of the configs $CONFIGS, round 1 in that order and each next
# round in the reverse of the one before; per config, setup CONFIG (the script's: it sets DEV),
# fio_fill, every job of $WORKLOADS (each after drop_caches), teardown CONFIG. Prints one line per round, config and
# job: RESULT ROUND CONFIG WORKLOAD KIB_PER_S IOPS.
bench_rounds() {
	_ifs=$IFS
	_round=1
	_order=$CONFIGS
	while [ $_round -le "$ROUNDS" ]; do
		for _c in $_order; do
			setup "$_c"
			fio_fill "$DEV"
			for _w in $WORKLOADS; do
				IFS=:
				set -- $_w
				IFS=$_ifs
				drop_caches # every job starts with the guest's page cache empty and clean
				before_job "$_c" "$1" "$_round"
				_name=$1
				set -- $(fio_job "$1" "$2" "$3" "$4" "$DEV")
				echo "RESULT $_round $_c $_name $1 $2"
				after_job "$_c" "$_name" "$_round"
			done
			teardown "$_c"
		done
		_rev=""
		for _c in $_order; do _rev="$_c $_rev"; done
		_order=$_rev
		_round=$((_round + 1))
	done
}

# stall_watch SECONDS: in the background, every 5 s, looks at each nbd device with requests in
# flight (/sys/block/nbdN/inflight, md too) whose completed requests (stat) have not moved for
# SECONDS, and then, once per stall, prints what the kernel and the servers are doing: the nbd
# driver's debugfs tasks file (its receive task, ioctl setups only), the stacks of the nbd
# driver's receive workers (kworker/...+nbdN-recv, and the workqueue's rescuer nbdN-recv) and
# of every nbdkit, raid5d, mdadm and fio thread, and the blocked tasks (sysrq w). The kernel
# client's own timeout should be longer than SECONDS (nbd-client -t), so the state is seen
# before the driver requeues. stall_unwatch stops it.
STALL_PID=
stall_watch() {
	STALL_SECS=$1
	[ -d /sys/kernel/debug/nbd ] || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
	echo 1 >/proc/sys/kernel/sysrq 2>/dev/null || true
	(
		while sleep 5; do
			for d in /sys/block/nbd* /sys/block/md*; do
				[ -e "$d/inflight" ] || continue
				n=${d#/sys/block/}
				set -- $(cat "$d/inflight")
				if [ $(($1 + $2)) = 0 ]; then
					eval "since_$n=0 seen_$n="
					continue
				fi
				done_now=$(awk '{ print $1 + $5 }' "$d/stat")
				eval "last=\${done_$n:-} since=\${since_$n:-0} seen=\${seen_$n:-}"
				if [ "$done_now" != "$last" ]; then
					eval "done_$n=$done_now since_$n=0 seen_$n="
					continue
				fi
				since=$((since + 5))
				eval "since_$n=$since"
				[ "$since" -ge "$STALL_SECS" ] || continue
				[ -z "$seen" ] || continue
				eval "seen_$n=1"
				stall_report "$n" "$since"
			done
		done
	) &
	STALL_PID=$!
}
stall_unwatch() {
	[ -z "$STALL_PID" ] || kill "$STALL_PID" 2>/dev/null || true
	STALL_PID=
}

# stall_report DEV SECONDS: what stall_watch prints.
stall_report() {
	echo "vm: STALL: $1: $(cat /sys/block/$1/inflight | tr -s ' ') in flight (reads writes), none completed for $2 s"
	for t in /sys/kernel/debug/nbd/$1/tasks; do
		[ -r "$t" ] && { echo "vm: STALL: $1 debugfs tasks:"; cat "$t"; }
	done
	for p in /proc/[0-9]*; do
		c=$(cat "$p/comm" 2>/dev/null) || continue
		# nbd*: nbd-client, and nbdN-recv, the receive workqueue's rescuer thread
		case $c in nbdkit | raid5d | knbd* | nbd* | kworker*nbd* | md*_raid5 | mdadm | fio) ;; *) continue ;; esac
		for t in "$p"/task/*; do
			echo "vm: STALL: pid ${p#/proc/} task ${t##*/} ($(cat "$t/comm" 2>/dev/null)) state $(awk '{ print $3 }' "$t/stat" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null)"
			sed 's/^/vm: STALL:     /' "$t/stack" 2>/dev/null | head -n 12
		done
	done
	echo w >/proc/sysrq-trigger 2>/dev/null || true
	dmesg | tail -n 80 | sed 's/^/vm: STALL: dmesg: /'
}
