# Where raid5d's time goes behind the kernel client (make profile-vm; RAID5D_VM_PROFILE=DIR):
# raid5d on the four RAM disks and md exported by nbdkit, each over TCP on loopback or a unix
# socket, attached with nbd-client -C 1, 2 or 4, fio's random 4 KiB and 48 KiB jobs; per job
# the IOPS, the server's CPU time per request (utime+stime from /proc, in clock ticks) and, for raid5d with one connection, a CPU profile
# (--pprof) sent out on the console in base64 between PPROF-BEGIN NAME and PPROF-END lines,
# which the test writes to DIR/NAME.pprof. Prints one line per job:
# PROF CONFIG CONNS WORKLOAD IOPS SERVER_CPU_US_PER_REQ.
#
# Environment: RUNTIME (seconds per job, 6), SIZE (MiB the jobs use, 256), SPECS (what runs, in
# order: SERVER:TRANSPORT:CONNS[:CLOCKSOURCE]; SERVER raid5d, raid5d-nb (--consistency none: no
# bitmap, as md here) or nbdkit; TRANSPORT tcp or unix; CONNS nbd-client's -C; CLOCKSOURCE
# switches the kernel's clock first, e.g. tsc where RAID5D_VM_APPEND="tsc=reliable" made it one).

RUNTIME=${RUNTIME:-6}
SIZE=${SIZE:-256}
SPECS=${SPECS:-raid5d:unix:1 nbdkit:unix:1 raid5d:tcp:1 nbdkit:tcp:1 raid5d-nb:unix:1 raid5d:unix:2 nbdkit:unix:2 raid5d:unix:4 nbdkit:unix:4}
NBDKIT_SOCK=/run/nbdkit.sock
MD=/dev/md0
PPROF=127.0.0.1:6060
SPACE=$IFS
HZ=100 # USER_HZ: /proc/PID/stat's clock ticks

# NAME:RW:BS:IODEPTH, as lib.sh's WORKLOADS
WORKLOADS="randread-4k:randread:4k:32 randwrite-4k:randwrite:4k:32 seqwrite-48k:write:48k:16"

log "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)" \
	"(available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
log "cpu flags: $(grep -m1 -o -w -E 'constant_tsc|nonstop_tsc|tsc_known_freq' /proc/cpuinfo | tr '\n' ' ')"

# ticks PID: the process' utime+stime, all its threads, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

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
		t0=$(ticks "$pid")
		set -- $config $conns $pid $prof
		iops=$(fio_job "$name" "$rw" "$bs" "$depth" "$NBD" | awk '{ print $2 }')
		t1=$(ticks "$pid")
		# fio's ramp second is not in its IOPS but is in the ticks: count RUNTIME+1 seconds
		reqs=$((iops * (RUNTIME + 1)))
		echo "PROF $config $conns $name $iops $(((t1 - t0) * (1000000 / HZ) / (reqs > 0 ? reqs : 1)))"
		if [ -n "$prof" ]; then
			wait "$wpid" || die "pprof of $name"
			echo "PPROF-BEGIN $config-$name"
			base64 "/tmp/$config-$name.pprof"
			echo "PPROF-END"
		fi
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
	raid5d | raid5d-nb)
		# raid5d-nb: --consistency none, no write-intent bitmap (as md at this size)
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
			serve --socket "$SOCK" $flags >/dev/null
			attach -u "$SOCK" -C $conns >/dev/null
		else
			serve $flags >/dev/null
			attach -C $conns >/dev/null
		fi
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
			nbd-client -u "$NBDKIT_SOCK" "$NBD" -b 4096 -C $conns >/dev/null || die "nbd-client -C $conns to nbdkit"
		else
			nbdkit --ipaddr 127.0.0.1 --port "$PORT" --pidfile /run/nbdkit.pid file file="$MD" || die "nbdkit"
			wait_for 30 "nbdkit to listen on $PORT" sh -c "netstat -ltn | grep -q ':$PORT '"
			nbd-client 127.0.0.1 "$PORT" "$NBD" -b 4096 -C $conns >/dev/null || die "nbd-client -C $conns to nbdkit"
		fi
		wait_for 30 "$NBD to have a size" sh -c "[ \$(cat /sys/block/nbd0/size) -gt 0 ]"
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
