#!/usr/bin/env bash
# raid5d with direct members (O_DIRECT, --direct auto: the default for block devices) against
# the same members through the page cache (--direct off), side by side in one run: 4 loop
# devices with direct I/O (losetup --direct-io=on) over files in DIR, 16 KiB chunks (48 KiB
# stripes), fio's nbd engine over a unix socket, the jobs of test/fio/peers (1 MiB and 48 KiB
# sequential writes, 4 KiB random writes, 1 MiB sequential and 4 KiB random reads). Each round
# runs both modes, alternating which goes first; the table shows medians of ROUNDS rounds and
# the direct/page-cache ratios of MB/s and of the daemon's CPU per I/O.
#
#   test/bench/direct.sh [DIR]     DIR defaults to /dev/shm/raid5d-direct (tmpfs: the devices are
#                                  not the bottleneck; /tmp on a disk shows a disk's figures)
#
# Environment: RUNTIME (seconds per job, 5), ROUNDS (3), MEMBER (member size, 512M), JOBS (job
# names, default all five). Needs root (losetup), fio and nbdinfo. Bounded: each job runs under
# a timeout; the daemon is stopped by PID and the loop devices detached by name on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-/dev/shm/raid5d-direct}
export RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-3}
MEMBER=${MEMBER:-512M}
JOBS=${JOBS:-seqwrite-1M seqwrite-48k randwrite-4k seqread-1M randread-4k}
for t in fio nbdinfo losetup python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
go build -o bin/raid5d ./cmd/raid5d

pid=
devs=()
stop() { if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; fi; }
cleanup() {
  stop
  for d in "${devs[@]}"; do losetup -d "$d" || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
for i in 0 1 2 3; do
  truncate -s "$MEMBER" "$DIR/disk$i.img"
  devs+=("$(losetup --direct-io=on -f --show "$DIR/disk$i.img")")
done
bin/raid5d create --chunk 16K "${devs[@]}" >/dev/null
results=$DIR/results
: >"$results"
sock=$DIR/nbd.sock uri="nbd+unix:///?socket=$DIR/nbd.sock"

start() { # mode: serve with --direct mode, wait until it answers
  bin/raid5d serve --socket "$sock" --control "$DIR/ctl.sock" --log-level warn --direct "$1" "${devs[@]}" &
  pid=$!
  for _ in $(seq 100); do nbdinfo --size "$uri" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "raid5d --direct $1 did not start"; exit 1
}

ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }

for round in $(seq "$ROUNDS"); do
  modes=(auto off); (( round % 2 )) || modes=(off auto)
  for mode in "${modes[@]}"; do
    start "$mode"
    # Fill the range the jobs touch, so reads are of written data.
    timeout 120 fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size=256M >/dev/null
    for job in $JOBS; do
      t0=$(ticks)
      out=$(NBD_URI=$uri timeout $((RUNTIME + 60)) fio --output-format=json "test/fio/peers/$job.fio" 2>/dev/null)
      t1=$(ticks)
      python3 -c '
import json, sys
job, mode, t0, t1, hz = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
text = sys.stdin.read(); j = json.loads(text[text.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
print(job, mode, d["bw_bytes"] / 1e6, (t1 - t0) / hz * 1e6 / max(ios, 1))
' "$job" "$mode" "$t0" "$t1" "$(getconf CLK_TCK)" <<<"$out" >>"$results"
    done
    stop
  done
done

echo "# raid5d on 4 loop devices (losetup --direct-io=on over $DIR), chunk 16K; medians of $ROUNDS rounds"
python3 - "$results" "$JOBS" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    job, mode, mbs, cpu = line.split()
    runs.setdefault((job, mode), []).append((float(mbs), float(cpu)))
med = {k: [statistics.median(c) for c in zip(*v)] for k, v in runs.items()}
print("%-14s %12s %12s %14s %14s %8s %9s" % ("job", "direct-MB/s", "cache-MB/s", "direct-cpu-us", "cache-cpu-us", "MB/s-x", "cpu/io-x"))
for job in sys.argv[2].split():
    (dm, dc), (cm, cc) = med[(job, "auto")], med[(job, "off")]
    print("%-14s %12.0f %12.0f %14.1f %14.1f %8.2f %9.2f" % (job, dm, cm, dc, cc, dm / cm, dc / cc))
PY
