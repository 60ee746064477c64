#!/usr/bin/env bash
# Rebuild speed and its cost to clients, side by side in one run (issue 5's figures):
#   1. raw sequential copy of one member file on the same filesystem (dd, fdatasync) = 1.0;
#   2. rebuild of one member onto a spare with the array idle;
#   3. rebuild while fio randread 4K (iodepth 32) runs, and that fio's IOPS beside
#   4. the same fio on the healthy array.
# Members of MEMBER (1G) each on /dev/shm. Bounded: fio runs at most RUNTIME seconds; the
# rebuild under load uses --sync-speed-min LOADMIN (default 200M, so it finishes within the run;
# md's default minimum of 1M/s would starve it on purpose). Every daemon is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/dev/shm/raid5d-rebuild}
MEMBER=${MEMBER:-1G}
RUNTIME=${RUNTIME:-20}
LOADMIN=${LOADMIN:-200M}
for t in fio python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
go build -o bin/raid5d ./cmd/raid5d
R=bin/raid5d
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
$R create --size "$MEMBER" "$DIR"/m{0..3}.img >/dev/null
truncate -s "$MEMBER" "$DIR"/spare{1,2}.img
CTL="$DIR/ctl.sock"
$R serve --socket "$DIR/s" --control "$CTL" --log-level warn --sync-speed-max 100G "$DIR"/m{0..3}.img &
pid=$!
for _ in $(seq 100); do [ -S "$DIR/s" ] && break; sleep 0.05; done
URI="nbd+unix:///?socket=$DIR/s"
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=16 >/dev/null

now() { date +%s.%N; }
# wait_rebuilt: poll status until no rebuild runs and nothing is missing; prints seconds taken.
wait_rebuilt() {
  local t0=$1
  while true; do
    st=$($R status --control "$CTL" --json 2>/dev/null || true)
    if python3 -c 'import json,sys; s=json.loads(sys.argv[1]); sys.exit(0 if not s.get("sync") and not s.get("missing") and s.get("state") in ("clean","active") else 1)' "$st" 2>/dev/null; then
      python3 -c "print('%.2f' % ($(now) - $t0))"; return
    fi
    sleep 0.05
  done
}
mbps() { python3 -c "print('%.0f' % ($1 / $2 / 1e6))"; }
bytes=$(python3 -c "import os; print(os.path.getsize('$DIR/m0.img') - (1<<20))")

# 1. dd of one member file.
t0=$(now); dd if="$DIR/m0.img" of="$DIR/copy.img" bs=1M conv=fdatasync status=none; t1=$(now); rm -f "$DIR/copy.img"
dd_s=$(python3 -c "print($t1 - $t0)")

# 2. Idle rebuild.
$R fail --control "$CTL" 1 >/dev/null; $R remove --control "$CTL" 1 >/dev/null
t0=$(now); $R add --control "$CTL" "$DIR/spare1.img" >/dev/null; idle_s=$(wait_rebuilt "$t0")

# 4. Healthy randread (before failing again).
fiorr() { fio --name=rr --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --iodepth=32 --time_based --runtime="$1" --output-format=json 2>/dev/null |
  python3 -c 'import json,sys; t=sys.stdin.read(); print("%.0f" % json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"])'; }
healthy_iops=$(fiorr 5)

# 3. Rebuild under randread.
$R rebuild --control "$CTL" --speed-min "$LOADMIN" >/dev/null
$R fail --control "$CTL" 2 >/dev/null; $R remove --control "$CTL" 2 >/dev/null
fiorr "$RUNTIME" > "$DIR/loaded_iops" &
fpid=$!
sleep 0.5
t0=$(now); $R add --control "$CTL" "$DIR/spare2.img" >/dev/null; load_s=$(wait_rebuilt "$t0")
pkill -INT -P $fpid fio 2>/dev/null || true   # stop fio when the rebuild ends: its IOPS cover the rebuild
wait $fpid || true; loaded_iops=$(cat "$DIR/loaded_iops")

printf '%-34s %10s %8s\n' what MB/s ratio
printf '%-34s %10s %8s\n' "dd copy of one member" "$(mbps "$bytes" "$dd_s")" 1.00
printf '%-34s %10s %8s\n' "rebuild, idle" "$(mbps "$bytes" "$idle_s")" "$(python3 -c "print('%.2f' % ($dd_s / $idle_s))")"
printf '%-34s %10s %8s\n' "rebuild, under randread 4K qd32" "$(mbps "$bytes" "$load_s")" "$(python3 -c "print('%.2f' % ($dd_s / $load_s))")"
printf '%-34s %10s %8s\n' "client IOPS healthy / rebuilding" "$healthy_iops/$loaded_iops" "$(python3 -c "print('%.2f' % ($loaded_iops / $healthy_iops))")"
echo "(rebuild under load took ${load_s}s with --sync-speed-min $LOADMIN; fio was stopped when it ended)"
