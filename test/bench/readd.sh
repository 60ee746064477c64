#!/usr/bin/env bash
# Re-add against a full rebuild (issue 17's figure), side by side in one run: a 4-member array
# of about 1 GiB (members of MEMBER, default 343M, on /dev/shm), one member failed, PERCENT (1)
# percent of its write-intent regions written by qemu-io, then `raid5d re-add` of that member;
# and the same member failed, removed and added back with `raid5d add` (a full rebuild). Each
# TRIALS (3) times; the times are the daemon's own (status --json last_rebuild: bytes moved
# past the resume point / bytes per second), medians printed with their ratio. The daemon is
# stopped by PID.
#
# REMOTE=1: the members are nbdkit file exports on TCP over loopback (nbd://127.0.0.1:PORT/,
# ports from PORT, default 20000 + PID % 10000), each behind nbdkit's delay filter when DELAY
# is set (e.g. DELAY=1ms on every member read and write); the servers are stopped by PID too.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/dev/shm/raid5d-readd}
MEMBER=${MEMBER:-343M}
PERCENT=${PERCENT:-1}
TRIALS=${TRIALS:-3}
REMOTE=${REMOTE:-0}
PORT=${PORT:-$((20000 + $$ % 10000))}
for t in qemu-io python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
[[ $REMOTE = 1 ]] && { command -v nbdkit >/dev/null || { echo "need nbdkit (make deps)"; exit 1; }; }
if [[ -z ${RAID5D:-} ]]; then
  go build -o bin/raid5d ./cmd/raid5d
  RAID5D=bin/raid5d
fi
R=$RAID5D
pid=""
servers=()
cleanup() {
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
wait_for() { until [ "$(field "$1")" = True ]; do sleep 0.05; done; }
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
qemu-io -f raw -c "write -P 0x11 0 $size" "$URI" >/dev/null

readd=(); full=()
for trial in $(seq "$TRIALS"); do
  wait_for 's["bitmap"]["set"] == 0'          # the cleaner has cleared the last trial's bits
  $R fail --control "$CTL" 1 >/dev/null
  qemu-io -f raw "${ops[@]}" "$URI" >/dev/null
  $R re-add --control "$CTL" "${members[1]}" >/dev/null; wait_for "$healthy"
  read -r secs bytes < <(last); readd+=("$secs"); echo "re-add  $trial: ${secs}s, $bytes bytes resynced"
  $R fail --control "$CTL" 1 >/dev/null; $R remove --control "$CTL" 1 >/dev/null
  $R add --control "$CTL" "${members[1]}" >/dev/null; wait_for "$healthy"
  read -r secs bytes < <(last); full+=("$secs"); echo "rebuild $trial: ${secs}s, $bytes bytes rebuilt"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
r=$(med "${readd[@]}"); f=$(med "${full[@]}")
echo "array $size bytes on ${members[*]}${DELAY:+ (+$DELAY per member request)}, $n of $regions regions ($PERCENT%) written while degraded"
echo "median re-add ${r}s, median full rebuild ${f}s, ratio $(python3 -c "print('%.4f' % ($r / $f))")"
