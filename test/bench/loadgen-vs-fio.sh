#!/usr/bin/env bash
# raid5d bench against fio on the same workload and the same server (issue 6's last figure):
# is the built-in load generator as fast as fio, and what does it cost? Servers: nbdkit's null
# plugin (the transport ceiling: the client is the bottleneck) and raid5d (4 members on
# /dev/shm). Workloads, one connection each, RUNTIME seconds: 4K randwrite QD32, 4K randread
# QD32, 1M sequential write QD16, over the first SIZE bytes. Each pair runs REPS times in
# alternating order (fio first, then bench first, ...) and the figures are the means.
#
#   test/bench/loadgen-vs-fio.sh [DIR]      DIR defaults to /dev/shm/raid5d-loadgen
#
# Environment: RUNTIME (seconds, 8), REPS (2), SIZE (256M), MEMBER (128M), RAID5D (a binary to
# use instead of building one). Bounded: every client runs under timeout RUNTIME+60; every
# server started here is stopped by PID.
#
# Prints per server and workload: MB/s and IOPS of each generator, its own CPU (user+system
# of the client process, from /usr/bin/time) in seconds and in µs per I/O, and the ratios
# bench/fio of throughput and of CPU per I/O.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-/dev/shm/raid5d-loadgen}
RUNTIME=${RUNTIME:-8}
REPS=${REPS:-2}
SIZE=${SIZE:-256M}
MEMBER=${MEMBER:-128M}
for t in fio nbdkit nbdinfo python3 /usr/bin/time timeout; do
  command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }
done
if [[ -z ${RAID5D:-} ]]; then
  go build -o bin/raid5d ./cmd/raid5d
  RAID5D=bin/raid5d
fi
rm -rf "$DIR"; mkdir -p "$DIR"
results=$DIR/results
: >"$results"

pid=
stop() { # stop the server started last, by PID
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
  fi
}
cleanup() { stop; rm -rf "$DIR"; }
trap cleanup EXIT

sock=$DIR/nbd.sock
uri="nbd+unix:///?socket=$sock"
start() { # server: start it on $sock and wait until it answers
  rm -f "$sock"
  case $1 in
    nbdkit-null) nbdkit --foreground --exit-with-parent --unix "$sock" null size=1G & ;;
    raid5d) rm -f "$DIR"/m?.img
            "$RAID5D" create --size "$MEMBER" "$DIR"/m{0..3}.img >/dev/null
            "$RAID5D" serve --socket "$sock" --control "$DIR/ctl.sock" --log-level warn "$DIR"/m{0..3}.img & ;;
  esac
  pid=$!
  for _ in $(seq 100); do
    nbdinfo --size "$uri" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "$1 did not start"; exit 1
}

# run client server workload: one timed run; appends "server workload client bytes ios user sys" to results.
run() {
  local client=$1 server=$2 w=$3 rw bs qd
  case $w in
    randwrite-4k) rw=randwrite bs=4K qd=32 ;;
    randread-4k) rw=randread bs=4K qd=32 ;;
    write-1m) rw=write bs=1M qd=16 ;;
  esac
  local out=$DIR/out tm=$DIR/time
  case $client in
    fio) /usr/bin/time -f '%U %S' -o "$tm" timeout $((RUNTIME + 60)) \
           fio --name=w --ioengine=nbd --uri="$uri" --rw=$rw --bs=$bs --iodepth=$qd --size="$SIZE" \
             --time_based --runtime="$RUNTIME" --output-format=json >"$out" 2>/dev/null ;;
    bench) /usr/bin/time -f '%U %S' -o "$tm" timeout $((RUNTIME + 60)) \
             "$RAID5D" bench "$uri" --rw $rw --bs $bs --iodepth $qd --size "$SIZE" \
               --time "${RUNTIME}s" --json >"$out" 2>/dev/null ;;
  esac
  python3 - "$client" "$server" "$w" "$out" "$tm" >>"$results" <<'PY'
import json, sys
client, server, w, out, tm = sys.argv[1:]
t = open(out).read()
j = json.loads(t[t.index("{"):])
if client == "fio":
    job = j["jobs"][0]
    b = job["read"]["io_bytes"] + job["write"]["io_bytes"]
    n = job["read"]["total_ios"] + job["write"]["total_ios"]
    secs = max(job["read"]["runtime"], job["write"]["runtime"]) / 1000
else:
    b, n = j["read_bytes"] + j["write_bytes"], j["read_ios"] + j["write_ios"]
    secs = j["elapsed_ns"] / 1e9
user, sys_ = open(tm).read().split()[-2:]
print(server, w, client, b / secs, n / secs, float(user) + float(sys_), n)
PY
}

for server in nbdkit-null raid5d; do
  start $server
  for w in randwrite-4k randread-4k write-1m; do
    for rep in $(seq "$REPS"); do
      if (( rep % 2 )); then order="fio bench"; else order="bench fio"; fi
      for c in $order; do run $c $server $w; done
    done
  done
  stop
done

python3 - "$results" <<'PY'
import sys
from collections import defaultdict
acc = defaultdict(lambda: [0, 0, 0, 0, 0])  # bytes/s, IOPS, CPU s, I/Os, runs
for line in open(sys.argv[1]):
    server, w, client, bps, iops, cpu, n = line.split()
    a = acc[(server, w, client)]
    a[0] += float(bps); a[1] += float(iops); a[2] += float(cpu); a[3] += int(n); a[4] += 1
print("%-12s %-13s %-6s %9s %9s %7s %9s" % ("server", "workload", "client", "MB/s", "IOPS", "CPU s", "CPU µs/IO"))
rows = {}
for (server, w, client), (bps, iops, cpu, n, runs) in acc.items():
    r = (bps / runs / 1e6, iops / runs, cpu / runs, cpu / n * 1e6)
    rows[(server, w, client)] = r
    print("%-12s %-13s %-6s %9.0f %9.0f %7.2f %9.1f" % ((server, w, client) + r))
print()
print("bench / fio:")
print("%-12s %-13s %11s %14s" % ("server", "workload", "throughput", "CPU per I/O"))
for (server, w, client), r in rows.items():
    if client != "bench" or (server, w, "fio") not in rows:
        continue
    f = rows[(server, w, "fio")]
    print("%-12s %-13s %10.2fx %13.2fx" % (server, w, r[0] / f[0], r[3] / f[3]))
PY
