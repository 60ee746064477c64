#!/usr/bin/env bash
# Re-add against a full rebuild (issue 17's figure), side by side in one run: a 4-member array
# of about 4 GiB (members of MEMBER, default 1400M, on /dev/shm: with the default write-intent
# region of 6 MiB, about 700 regions, so that 1% of them is 7 regions and not 1 or 2), one
# member failed, PERCENT (1) percent of its write-intent regions written by qemu-io, then
# `raid5d re-add` of that member;
# and the same member failed, removed and added back with `raid5d add` (a full rebuild). Each
# TRIALS (3) times; the times are the daemon's own (status --json last_rebuild: bytes moved
# past the resume point / bytes per second), medians printed with their ratio. The daemon is
# stopped by PID.
#
# REMOTE=1: the members are nbdkit file exports on TCP over loopback (nbd://127.0.0.1:PORT/,
# ports from PORT, default 20000 + PID % 10000), each behind nbdkit's delay filter when DELAY
# is set (e.g. DELAY=1ms on every member read and write); the servers are stopped by PID too.
#
# PROBE=1: while each re-add and each rebuild runs (from a second before it starts until status
# shows it done), fio (nbd engine, one connection) reads 4 KiB at random offsets of the array
# at queue depth 1, and the clients' latency is printed: the reads of the failed member's
# chunks are rebuilt from the others under their stripes' locks, so they wait for what the
# resync holds. PROBE_RW=randwrite: random 4 KiB writes instead (a write that reaches what a
# full rebuild has rebuilt since its last checkpoint records its position first). Every wait is
# bounded (TIMEOUT seconds, 300).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/dev/shm/raid5d-readd}
MEMBER=${MEMBER:-1400M}
PERCENT=${PERCENT:-1}
TRIALS=${TRIALS:-3}
REMOTE=${REMOTE:-0}
PORT=${PORT:-$((20000 + $$ % 10000))}
PROBE=${PROBE:-0}
PROBE_RW=${PROBE_RW:-randread}
TIMEOUT=${TIMEOUT:-300}
[[ $PROBE = 1 ]] && { command -v fio >/dev/null || { echo "need fio for PROBE=1 (make deps)"; exit 1; }; }
for t in qemu-io python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
[[ $REMOTE = 1 ]] && { command -v nbdkit >/dev/null || { echo "need nbdkit (make deps)"; exit 1; }; }
if [[ -z ${RAID5D:-} ]]; then
  go build -o bin/raid5d ./cmd/raid5d
  RAID5D=bin/raid5d
fi
R=$RAID5D
pid=""
probe=""
servers=()
cleanup() {
  [ -n "$probe" ] && kill "$probe" 2>/dev/null && wait "$probe" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  for p in "${servers[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
members=()
if [[ $REMOTE = 1 ]]; then
  for k in 0 1 2 3; do
    truncate -s "$MEMBER" "$DIR/m$k.img"
    nbdkit --foreground --threads 64 --ipaddr 127.0.0.1 --port $((PORT + k)) ${DELAY:+--filter=delay} \
      file file="$DIR/m$k.img" ${DELAY:+delay-read=$DELAY delay-write=$DELAY} 2>>"$DIR/nbdkit.log" &
    servers+=($!)
    members+=("nbd://127.0.0.1:$((PORT + k))/")
  done
  for k in 0 1 2 3; do
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$((PORT + k))) 2>/dev/null && break; sleep 0.05; done
  done
  $R create "${members[@]}" >/dev/null
else
  members=("$DIR"/m{0..3}.img)
  $R create --size "$MEMBER" "${members[@]}" >/dev/null
fi
CTL="$DIR/ctl.sock"
$R serve --socket "$DIR/s" --control "$CTL" --log-level warn --sync-speed-min 100G --sync-speed-max 100G "${members[@]}" &
pid=$!
for _ in $(seq 100); do [ -S "$DIR/s" ] && break; sleep 0.05; done
URI="nbd+unix:///?socket=$DIR/s"
st() { $R status --control "$CTL" --json 2>/dev/null || true; }
field() { python3 -c "import json,sys; s=json.loads(sys.argv[1]); print(eval(sys.argv[2]))" "$(st)" "$1"; }
wait_for() {
  local end=$((SECONDS + TIMEOUT))
  until [ "$(field "$1")" = True ]; do
    ((SECONDS < end)) || { echo "not true after ${TIMEOUT}s: $1"; exit 1; }
    sleep 0.05
  done
}
# probe_start / probe_stop NAME: fio's random 4 KiB reads while a resync runs (PROBE=1); the
# latencies are printed at the stop.
probe_start() {
  [[ $PROBE = 1 ]] || return 0
  timeout $((TIMEOUT + 60)) fio --name=probe --ioengine=nbd --uri="$URI" --rw="$PROBE_RW" --bs=4k --iodepth=1 \
    --time_based=1 --runtime=$((TIMEOUT + 30)) --output-format=json --output="$DIR/probe.json" >/dev/null 2>&1 &
  probe=$!
  sleep 1 # connected and reading
}
probe_stop() {
  [[ $PROBE = 1 ]] || return 0
  kill -INT "$probe"; wait "$probe" || true; probe=""
  python3 - "$DIR/probe.json" "$1" "${PROBE_RW#rand}" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
r = json.loads(text[text.index("{"):])["jobs"][0][sys.argv[3]]
c = r["clat_ns"]
print("  %s: client 4k %ss meanwhile: %d, mean %.0f us, p99.9 %.0f us, max %.1f ms" % (sys.argv[2], sys.argv[3], r["total_ios"],
      c["mean"] / 1e3, c.get("percentile", {}).get("99.900000", 0) / 1e3, c["max"] / 1e6))
PY
}
healthy='not s.get("sync") and not s.get("missing") and s.get("state") in ("clean","active")'
# The daemon's time for the last rebuild, and the bytes it wrote onto the member.
last() { field '"%.3f %d" % ((s["last_rebuild"]["done"]-s["last_rebuild"]["resumed"])/s["last_rebuild"]["bytes_per_sec"], s["last_rebuild"]["resynced"])'; }
size=$(field 's["size"]')
region=$(field 's["bitmap"]["region_bytes"]')
regions=$(field 's["bitmap"]["regions"]')
n=$(( regions * PERCENT / 100 ))
step=$(( regions / n ))
ops=()
for i in $(seq 0 $((n - 1))); do ops+=(-c "write -P 0x5a $(( i * step * region )) $region"); done
fill=() # the whole array written once, in pieces of at most 1 GiB (qemu-io's limit is 2 GiB)
for ((o = 0; o < size; o += 1 << 30)); do fill+=(-c "write -P 0x11 $o $(( size - o < 1 << 30 ? size - o : 1 << 30 ))"); done
qemu-io -f raw "${fill[@]}" "$URI" >/dev/null

readd=(); full=()
for trial in $(seq "$TRIALS"); do
  wait_for 's["bitmap"]["set"] == 0'          # the cleaner has cleared the last trial's bits
  $R fail --control "$CTL" 1 >/dev/null
  qemu-io -f raw "${ops[@]}" "$URI" >/dev/null
  probe_start
  $R re-add --control "$CTL" "${members[1]}" >/dev/null; wait_for "$healthy"
  read -r secs bytes < <(last); readd+=("$secs"); echo "re-add  $trial: ${secs}s, $bytes bytes resynced"
  probe_stop "re-add  $trial"
  $R fail --control "$CTL" 1 >/dev/null; $R remove --control "$CTL" 1 >/dev/null
  probe_start
  $R add --control "$CTL" "${members[1]}" >/dev/null; wait_for "$healthy"
  read -r secs bytes < <(last); full+=("$secs"); echo "rebuild $trial: ${secs}s, $bytes bytes rebuilt"
  probe_stop "rebuild $trial"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
r=$(med "${readd[@]}"); f=$(med "${full[@]}")
echo "array $size bytes on ${members[*]}${DELAY:+ (+$DELAY per member request)}, $n of $regions regions of $region bytes ($PERCENT%, $((n * region)) bytes) written while degraded; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "median re-add ${r}s, median full rebuild ${f}s, ratio $(python3 -c "print('%.4f' % ($r / $f))")"
