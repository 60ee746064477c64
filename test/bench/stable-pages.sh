#!/usr/bin/env bash
# The copies of a full-stripe write, side by side in one run: the copying mode (stable pages
# off, placed writes off: the payload is copied into the cache), stable pages (the request
# buffer is written to the members as it is), and placed writes (the default: the payload is
# read from the socket straight into the members' mappings, no request buffer at all); 4
# members, 16 KiB chunk (48 KiB stripe), fio writing one full stripe per I/O
# (test/fio/stripe48k.fio, and a queue-depth-16 variant without per-write flushes). Prints
# throughput and the daemon's CPU seconds per GB written (utime+stime from /proc), bytes copied
# into the cache per byte written (from the daemon's counters at exit, warm-up included), and each mode's ratios
# to the copying mode. Members live on /dev/shm so the members are
# not the bottleneck. Each run starts a daemon and writes WARM seconds (default 3) before it
# measures, so that the figures are a running daemon's, not its first pass over the members
# (whose mappings it fills then). Bounded: RUNTIME seconds per run (default 8), ROUNDS
# alternations (default 3, median reported); every daemon started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/dev/shm/raid5d-stable}
RUNTIME=${RUNTIME:-8}
WARM=${WARM:-3}
ROUNDS=${ROUNDS:-3}
command -v fio >/dev/null || { echo "need fio (make deps)"; exit 1; }
go build -o bin/raid5d ./cmd/raid5d
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
bin/raid5d create --chunk 16K --size 640M "$DIR"/m{0..3}.img >/dev/null
tck=$(getconf CLK_TCK)

run() { # flags... ; prints "MB/s cpu_s_per_GB"
  local job=$1; shift
  bin/raid5d serve --socket "$DIR/s" --log-format json "$@" "$DIR"/m{0..3}.img 2>"$DIR/log" &
  pid=$!
  for _ in $(seq 100); do [ -S "$DIR/s" ] && break; sleep 0.05; done
  local warm='{"jobs": [{"write": {"io_bytes": 0}}]}'
  [ "$WARM" -gt 0 ] && warm=$(NBD_URI="nbd+unix:///?socket=$DIR/s" RUNTIME=$WARM fio --output-format=json "$job" 2>/dev/null)
  local t0; t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  local out; out=$(NBD_URI="nbd+unix:///?socket=$DIR/s" RUNTIME=$RUNTIME fio --output-format=json "$job" 2>/dev/null)
  local t1; t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill "$pid"; wait "$pid" || true; pid=""
  python3 - "$out" "$t0" "$t1" "$tck" "$DIR/log" "$warm" <<'PY'
import json, sys
t = sys.argv[1]; j = json.loads(t[t.index("{"):])["jobs"][0]["write"]
w = sys.argv[6]; warm = json.loads(w[w.index("{"):])["jobs"][0]["write"]["io_bytes"]
cpu = (float(sys.argv[3]) - float(sys.argv[2])) / float(sys.argv[4])
gb = j["io_bytes"] / 1e9
# The daemon's counters at exit: bytes copied into the cache per byte written.
ctr = [json.loads(l) for l in open(sys.argv[5]) if '"full_stripe_writes"' in l][-1]
print("%.0f %.3f %.2f" % (j["bw_bytes"] / 1e6, cpu / gb if gb else 0, ctr["bytes_copied"] / max(1, j["io_bytes"] + warm)))
PY
}

qd16=$(mktemp); trap 'cleanup; rm -f "$qd16"' EXIT
sed -e 's/^iodepth=1/iodepth=16/' -e 's/^fsync=1/end_fsync=1/' test/fio/stripe48k.fio > "$qd16"

printf '%-18s %-8s %9s %12s %9s %7s %8s\n' workload mode MB/s cpu-s/GB copied MB/s-x cpu/GB-x
for job in test/fio/stripe48k.fio "$qd16"; do
  name="48k qd1 fsync=1"; [ "$job" = "$qd16" ] && name="48k qd16"
  copy=(); stable=(); placed=()
  for r in $(seq "$ROUNDS"); do
    copy+=("$(run "$job" --stable-pages=false --mapped-writes=false)")
    stable+=("$(run "$job" --stable-pages --mapped-writes=false)")
    placed+=("$(run "$job" --stable-pages=false --mapped-writes)")
  done
  python3 - "$name" "${copy[@]}" -- "${stable[@]}" -- "${placed[@]}" <<'PY'
import sys, statistics as st
a = sys.argv[2:]; groups = [[]]
for x in a:
    if x == "--": groups.append([])
    else: groups[-1].append(x.split())
med = lambda rows, k: st.median(float(r[k]) for r in rows)
base = groups[0]
for mode, rows in zip(["copy", "stable", "placed"], groups):
    b, c, x = med(rows, 0), med(rows, 1), med(rows, 2)
    print("%-18s %-8s %9.0f %12.3f %9.2f %7.2f %8.2f" % (sys.argv[1], mode, b, c, x, b / med(base, 0), c / med(base, 1)))
PY
done
