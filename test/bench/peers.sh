#!/usr/bin/env bash
# Side-by-side fio figures: raid5d (4 members) vs nbdkit's file plugin over one file, same
# filesystem, same transport (loopback TCP), same fio jobs, one run. Bounded: each job runs
# RUNTIME seconds; every server started here is stopped by PID.
#
#   test/bench/peers.sh [DIR]      DIR defaults to /dev/shm/raid5d-bench
#
# Prints one line per workload and server, and raid5d's ratio to nbdkit.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-/dev/shm/raid5d-bench}
RUNTIME=${RUNTIME:-8}
MEMBER=${MEMBER:-512M}
PORT_R=${PORT_R:-10911}
PORT_K=${PORT_K:-10912}
for t in fio nbdkit; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done

go build -o bin/raid5d ./cmd/raid5d
rm -rf "$DIR"; mkdir -p "$DIR"
bin/raid5d create --size "$MEMBER" "$DIR"/m{0..3}.img >/dev/null
size=$(bin/raid5d status "$DIR"/m{0..3}.img | awk '/size:/{gsub(/[()]/,"",$3); print $3; exit}')
truncate -s "$size" "$DIR/peer.img"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT

bin/raid5d serve --listen 127.0.0.1:$PORT_R --log-level warn "$DIR"/m{0..3}.img &
pids+=($!)
nbdkit --foreground --exit-with-parent --port $PORT_K --ipaddr 127.0.0.1 file "$DIR/peer.img" &
pids+=($!)
for p in $PORT_R $PORT_K; do
  for _ in $(seq 50); do nbdinfo --size nbd://127.0.0.1:$p >/dev/null 2>&1 && break; sleep 0.1; done
done

# name rw bs iodepth
jobs=(
  "seqwrite-1M write 1M 32"
  "seqread-1M read 1M 32"
  "randwrite-4k randwrite 4k 32"
  "randread-4k randread 4k 32"
)
fiojob() { # uri rw bs depth -> "MB/s IOPS"
  fio --name=j --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" --size=256M \
      --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; d=j["read"] if j["read"]["io_bytes"] else j["write"]; print("%.0f %.0f" % (d["bw_bytes"]/1e6, d["iops"]))'
}
# Fill both so reads are of written data, not holes.
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:$PORT_R --rw=write --bs=1M --iodepth=16 --size=256M >/dev/null
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:$PORT_K --rw=write --bs=1M --iodepth=16 --size=256M >/dev/null

printf '%-14s %12s %12s %12s %12s %8s\n' workload raid5d-MB/s raid5d-IOPS nbdkit-MB/s nbdkit-IOPS ratio
for j in "${jobs[@]}"; do
  set -- $j
  read -r rb ri < <(fiojob nbd://127.0.0.1:$PORT_R "$2" "$3" "$4")
  read -r kb ki < <(fiojob nbd://127.0.0.1:$PORT_K "$2" "$3" "$4")
  printf '%-14s %12s %12s %12s %12s %8s\n' "$1" "$rb" "$ri" "$kb" "$ki" "$(python3 -c "print('%.2f' % ($ri/$ki if $ki else 0))")"
done
