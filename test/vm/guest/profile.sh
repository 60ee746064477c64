# Where raid5d's time goes behind the kernel client (make profile-vm; RAID5D_VM_PROFILE=DIR):
# raid5d on the four RAM disks and md exported by nbdkit, each over TCP on loopback or a unix
# socket, attached with nbd-client -C 1, 2 or 4, fio's random 4 KiB and 48 KiB jobs; per job
# the IOPS, the server's CPU time per request (utime+stime from /proc, in clock ticks) and, for raid5d with one connection, a CPU profile
# (--pprof) sent out on the console in base64 between PPROF-BEGIN NAME and PPROF-END lines,
# which the test writes to DIR/NAME.pprof. Prints one line per job:
# PROF CONFIG CONNS WORKLOAD IOPS SERVER_CPU_US_PER_REQ READ_CALLS_PER_REQ WRITE_CALLS_PER_REQ
# (the server's read and write system calls, all its threads, from /proc/PID/io's syscr and
# syscw: socket reads, member and reply writes).
#
# For raid5d, each job's deltas of its array and bitmap counters (raid5d status, metrics) are
# logged; with TRACE=1,
# also the requests the kernel client issued on $NBD (the block layer's block_rq_issue
# tracepoint): how many, their sizes, and how many were whole 48 KiB stripes.
#
# Environment: RUNTIME (seconds per job, 6), SIZE (MiB the jobs use, 256), SPECS (what runs, in
# order: SERVER:TRANSPORT:CONNS[:CLOCKSOURCE]; SERVER raid5d, raid5d-nb (--consistency none: no
# bitmap, as md here), raid5d-b (the binary RAID5D_VM_B names: a before/after) or nbdkit; TRANSPORT tcp or unix; CONNS nbd-client's -C; CLOCKSOURCE
# switches the kernel's clock first, e.g. tsc where RAID5D_VM_APPEND="tsc=reliable" made it one),
# JOBS (the workloads' names, of randread-4k randwrite-4k seqwrite-48k seqwrite-1M; the first
# three by default), SERVE_FLAGS (more flags
# for raid5d serve, e.g. --write-back-delay 50ms), QUEUE (ATTR=VALUE settings of $NBD's queue
# after attach, e.g. nomerges=2 max_sectors_kb=1024), TRACE (1: the request trace above).

RUNTIME=${RUNTIME:-6}
SIZE=${SIZE:-256}
SPECS=${SPECS:-raid5d:unix:1 nbdkit:unix:1 raid5d:tcp:1 nbdkit:tcp:1 raid5d-nb:unix:1 raid5d:unix:2 nbdkit:unix:2 raid5d:unix:4 nbdkit:unix:4}
NBDKIT_SOCK=/run/nbdkit.sock
MD=/dev/md0
PPROF=127.0.0.1:6060
SPACE=$IFS
HZ=100 # USER_HZ: /proc/PID/stat's clock ticks

# NAME:RW:BS:IODEPTH, as lib.sh's WORKLOADS
WORKLOADS=""
for w in randread-4k:randread:4k:32 randwrite-4k:randwrite:4k:32 seqwrite-48k:write:48k:16 seqwrite-1M:write:1M:16; do
	case " ${JOBS:-randread-4k randwrite-4k seqwrite-48k} " in *" ${w%%:*} "*) WORKLOADS="$WORKLOADS $w" ;; esac
done
TRACING=/sys/kernel/tracing

log "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)" \
	"(available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
log "cpu flags: $(grep -m1 -o -w -E 'constant_tsc|nonstop_tsc|tsc_known_freq' /proc/cpuinfo | tr '\n' ' ')"

# ticks PID: the process' utime+stime, all its threads, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# counters: raid5d's array counters as NAME=VALUE words (status --json's "counters").
counters() {
	raid5d status --json 2>/dev/null | tr -d '\n ' | sed 's/.*"counters":{//; s/}.*//' | tr ',' '\n' | tr -d '"' | tr ':' '='
	wget -q -O - "http://$METRICS/metrics" | awk '$1 == "raid5d_bitmap_flushes_total" { print "bitmap_flushes=" $2 }
		$1 == "raid5d_bitmap_waits_total" { print "bitmap_waits=" $2 }'
}

# counter_deltas BEFORE AFTER: the counters that moved, NAME+DELTA.
counter_deltas() {
	echo "$1" >/tmp/c0
	echo "$2" | awk -F= 'NR == FNR { c0[$1] = $2; next } $2 != c0[$1] { printf " %s+%d", $1, $2 - c0[$1] }' /tmp/c0 -
}

# trace_start and trace_stop: block_rq_issue on $NBD during a job (TRACE=1); trace_stop
# summarises the writes issued: count, whole stripes (48 KiB aligned, 96 sectors, multiples of
# it), the sizes seen most.
trace_start() {
	[ "${TRACE:-}" = 1 ] || return 0
	[ -e $TRACING/trace ] || mount -t tracefs nodev $TRACING || die "tracefs"
	echo 0 >$TRACING/tracing_on
	echo 16384 >$TRACING/buffer_size_kb
	echo >$TRACING/trace
	echo "dev == $((43 << 20))" >$TRACING/events/block/block_rq_issue/filter # nbd0: 43,0
	echo 1 >$TRACING/events/block/block_rq_issue/enable
	echo 1 >$TRACING/tracing_on
}

trace_stop() {
	[ "${TRACE:-}" = 1 ] || return 0
	echo 0 >$TRACING/tracing_on
	echo 0 >$TRACING/events/block/block_rq_issue/enable
	# ... block_rq_issue: 43,0 WS 98304 () SECTOR + NR [fio]
	awk '/block_rq_issue:/ { for (i = 1; i < NF; i++) if ($i == "+") { sec = $(i - 1); nr = $(i + 1) }
		for (i = 1; i < NF; i++) if ($i == "block_rq_issue:") rw = $(i + 2)
		if (rw !~ /W/ || nr == 0) next
		n++; kib[nr / 2]++; if (sec % 96 == 0 && nr % 96 == 0) whole++
		if (sec % 96 != 0) unaligned++ }
		END { printf "vm: trace: %d writes issued on nbd0, %d whole stripes, %d not starting on one; KiB:count", n, whole, unaligned
		for (k in kib) if (kib[k] * 50 >= n) printf " %d:%d", k, kib[k]; print "" }' $TRACING/trace
	echo >$TRACING/trace
}

# syscalls PID: the process' read and write system calls so far (syscr, syscw), all threads.
syscalls() { awk '$1 == "syscr:" { r = $2 } $1 == "syscw:" { w = $2 } END { print r, w }' "/proc/$1/io"; }

# run CONFIG CONNS PID [PROFILE]: the workloads on $NBD, served by PID; with PROFILE, a CPU
# profile of raid5d during each job.
run() {
	fio_fill "$NBD"
	for w in $WORKLOADS; do
		IFS=:
		set -- $w "$@"
		IFS=$SPACE
		name=$1 rw=$2 bs=$3 depth=$4 config=$5 conns=$6 pid=$7 prof=${8:-}
		if [ -n "$prof" ]; then
			wget -q -O "/tmp/$config-$name.pprof" "http://$PPROF/debug/pprof/profile?seconds=$((RUNTIME - 1))" &
			wpid=$!
		fi
		case $config in raid5d*) c0=$(counters) ;; esac
		trace_start
		t0=$(ticks "$pid") s0=$(syscalls "$pid")
		set -- $config $conns $pid $prof
		iops=$(fio_job "$name" "$rw" "$bs" "$depth" "$NBD" | awk '{ print $2 }')
		t1=$(ticks "$pid") s1=$(syscalls "$pid")
		trace_stop
		case $config in raid5d*) log "$config $name counters:$(counter_deltas "$c0" "$(counters)")" ;; esac
		# fio's ramp second is not in its IOPS but is in the ticks: count RUNTIME+1 seconds
		reqs=$((iops * (RUNTIME + 1)))
		calls=$(echo "$s0 $s1 $reqs" | awk '{ n = $5 > 0 ? $5 : 1; printf "%.1f %.1f", ($3 - $1) / n, ($4 - $2) / n }')
		echo "PROF $config $conns $name $iops $(((t1 - t0) * (1000000 / HZ) / (reqs > 0 ? reqs : 1))) $calls"
		if [ -n "$prof" ]; then
			wait "$wpid" || die "pprof of $name"
			echo "PPROF-BEGIN $config-$name"
			base64 "/tmp/$config-$name.pprof"
			echo "PPROF-END"
		fi
	done
}

# queue: $QUEUE's settings of $NBD's queue.
queue() {
	for q in ${QUEUE:-}; do
		echo "${q#*=}" >"/sys/block/nbd0/queue/${q%%=*}" || die "queue $q"
	done
}

# SPEC is SERVER:TRANSPORT:CONNS; raid5d is profiled with one connection
for spec in $SPECS; do
	IFS=:
	set -- $spec
	IFS=$SPACE
	server=$1 transport=$2 conns=$3 clock=${4:-}
	if [ -n "$clock" ]; then
		echo "$clock" >/sys/devices/system/clocksource/clocksource0/current_clocksource || die "clocksource $clock"
		log "clocksource now $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
	fi
	case $server in
	raid5d | raid5d-nb | raid5d-b)
		# raid5d-nb: --consistency none, no write-intent bitmap (as md at this size); raid5d-b:
		# the second binary (RAID5D_VM_B)
		RAID5D_BIN=raid5d
		[ $server != raid5d-b ] || RAID5D_BIN=raid5d-b
		if [ -e /sys/block/md0/md ]; then
			mdadm --stop "$MD" >/dev/null 2>&1 || die "mdadm --stop"
			mdadm --zero-superblock $MEMBERS >/dev/null 2>&1 || true
		fi
		if [ "${CREATED:-}" != $server ]; then
			if [ $server = raid5d-nb ]; then create --chunk 16K --consistency none; else create --chunk 16K; fi
			CREATED=$server
		fi
		flags=""
		[ $conns != 1 ] || flags="--pprof $PPROF"
		if [ $transport = unix ]; then
			serve --socket "$SOCK" $flags ${SERVE_FLAGS:-} >/dev/null
			attach -u "$SOCK" -C $conns >/dev/null
		else
			serve $flags ${SERVE_FLAGS:-} >/dev/null
			attach -C $conns >/dev/null
		fi
		queue
		if [ $conns = 1 ]; then run $server-$transport${clock:+-$clock} $conns "$RAID5D_PID" profile; else run $server-$transport${clock:+-$clock} $conns "$RAID5D_PID"; fi
		raid5d status --json >/tmp/status.json 2>&1 && log "raid5d status counters: $(tr -d '\n ' </tmp/status.json | sed 's/.*"counters"://')"
		detach
		stop_daemon
		;;
	nbdkit)
		CREATED=
		if [ ! -e /sys/block/md0/md ]; then
			mdadm --create "$MD" --run --force --assume-clean --level=5 --raid-devices=4 --chunk=16 \
				--metadata=1.2 $MEMBERS >/tmp/mdadm.out 2>&1 || { cat /tmp/mdadm.out; die "mdadm --create"; }
			wait_for 30 "$MD" test -b "$MD"
		fi
		if [ $transport = unix ]; then
			rm -f "$NBDKIT_SOCK"
			nbdkit --unix "$NBDKIT_SOCK" --pidfile /run/nbdkit.pid file file="$MD" || die "nbdkit"
			wait_for 30 "nbdkit's socket" test -S "$NBDKIT_SOCK"
			nbd_connect "$NBD" -u "$NBDKIT_SOCK" "$NBD" -b 4096 -C $conns
		else
			nbdkit --ipaddr 127.0.0.1 --port "$PORT" --pidfile /run/nbdkit.pid file file="$MD" || die "nbdkit"
			wait_for 30 "nbdkit to listen on $PORT" sh -c "netstat -ltn | grep -q ':$PORT '"
			nbd_connect "$NBD" 127.0.0.1 "$PORT" "$NBD" -b 4096 -C $conns
		fi
		queue
		run md+nbdkit-$transport${clock:+-$clock} $conns "$(cat /run/nbdkit.pid)"
		detach
		kill "$(cat /run/nbdkit.pid)"
		wait_for 30 "nbdkit to exit" sh -c '! kill -0 $(cat /run/nbdkit.pid)'
		;;
	*) die "unknown server in $spec" ;;
	esac
done
dmesg_clean
log "profile done"
