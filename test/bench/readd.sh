#!/usr/bin/env bash
# Re-add against a full rebuild (issue 17's figure), side by side in one run: a 4-member array
# of about 1 GiB (members of MEMBER, default 343M, on /dev/shm), one member failed, PERCENT (1)
# percent of its write-intent regions written by qemu-io, then `raid5d re-add` of that member;
# and the same member failed, removed and added back with `raid5d add` (a full rebuild). Each
# TRIALS (3) times; the times are the daemon's own (status --json last_rebuild: bytes moved
# past the resume point / bytes per second), medians printed with their ratio. The daemon is
# stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/dev/shm/raid5d-readd}
MEMBER=${MEMBER:-343M}
PERCENT=${PERCENT:-1}
TRIALS=${TRIALS:-3}
for t in qemu-io python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
go build -o bin/raid5d ./cmd/raid5d
R=bin/raid5d
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
$R create --size "$MEMBER" "$DIR"/m{0..3}.img >/dev/null
CTL="$DIR/ctl.sock"
$R serve --socket "$DIR/s" --control "$CTL" --log-level warn --sync-speed-min 100G --sync-speed-max 100G "$DIR"/m{0..3}.img &
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
  $R re-add --control "$CTL" "$DIR/m1.img" >/dev/null; wait_for "$healthy"
  read -r secs bytes < <(last); readd+=("$secs"); echo "re-add  $trial: ${secs}s, $bytes bytes resynced"
  $R fail --control "$CTL" 1 >/dev/null; $R remove --control "$CTL" 1 >/dev/null
  $R add --control "$CTL" "$DIR/m1.img" >/dev/null; wait_for "$healthy"
  read -r secs bytes < <(last); full+=("$secs"); echo "rebuild $trial: ${secs}s, $bytes bytes rebuilt"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
r=$(med "${readd[@]}"); f=$(med "${full[@]}")
echo "array $size bytes, $n of $regions regions ($PERCENT%) written while degraded"
echo "median re-add ${r}s, median full rebuild ${f}s, ratio $(python3 -c "print('%.4f' % ($r / $f))")"
