#!/usr/bin/env bash
# --member-conns 1 vs 2 vs 4, side by side in one run: raid5d over 4 remote members, each an
# nbdkit file plugin export (it advertises CAN_MULTI_CONN) of a file on /dev/shm, served on a
# unix socket; fio's nbd engine drives the array with test/fio/peers/seqwrite-1M.fio and
# randread-4k.fio. Prints the median MB/s of ROUNDS alternations (default 3) of each, the
# ratios to the first of CONNS (default "1 2 4"), and the samples. NBDKIT_OPTS and NBDKIT_KEYS
# add nbdkit options and keys, e.g. NBDKIT_OPTS=--filter=delay NBDKIT_KEYS="delay-read=5ms
# delay-write=5ms". Bounded: RUNTIME seconds per fio run (default 8); every process
# started here is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/dev/shm/raid5d-conns}
RUNTIME=${RUNTIME:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-1 2 4}
for t in fio nbdkit; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
go build -o bin/raid5d ./cmd/raid5d
pids=()
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
uris=()
for i in 0 1 2 3; do
  truncate -s 160M "$DIR/m$i.img"
  # shellcheck disable=SC2086 # NBDKIT_OPTS and NBDKIT_KEYS are lists of words
  nbdkit --foreground --unix "$DIR/m$i.sock" ${NBDKIT_OPTS:-} file file="$DIR/m$i.img" ${NBDKIT_KEYS:-} &
  pids+=($!)
  uris+=("nbd+unix:///?socket=$DIR/m$i.sock")
done
for i in 0 1 2 3; do for _ in $(seq 100); do [ -S "$DIR/m$i.sock" ] && break; sleep 0.05; done; done
bin/raid5d create --chunk 64K "${uris[@]}" >/dev/null

run() { # job conns; prints MB/s
  bin/raid5d serve --socket "$DIR/s" --control "$DIR/c" --member-conns "$2" "${uris[@]}" 2>"$DIR/log" &
  pid=$!
  for _ in $(seq 200); do [ -S "$DIR/s" ] && break; sleep 0.05; done
  local out; out=$(NBD_URI="nbd+unix:///?socket=$DIR/s" RUNTIME=$RUNTIME fio --output-format=json "$1" 2>/dev/null)
  kill "$pid"; wait "$pid" || true; pid=""
  python3 -c '
import json, sys
t = sys.argv[1]; j = json.loads(t[t.index("{"):])["jobs"][0]
print("%.0f" % ((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6))' "$out"
}

printf '%-14s' workload; for c in $CONNS; do printf ' %9s' "conns=$c"; done; for c in $CONNS; do printf ' %7s' "x$c"; done; echo
for job in test/fio/peers/seqwrite-1M.fio test/fio/peers/randread-4k.fio; do
  declare -A res=()
  for r in $(seq "$ROUNDS"); do
    for c in $CONNS; do res[$c]+="$(run "$job" "$c") "; done
  done
  args=(); for c in $CONNS; do args+=("${res[$c]}"); done
  python3 - "$(basename "$job" .fio)" "${args[@]}" <<'PY'
import sys, statistics as st
meds = [st.median(float(x) for x in a.split()) for a in sys.argv[2:]]
print("%-14s" % sys.argv[1] + "".join(" %9.0f" % m for m in meds) + "".join(" %7.2f" % (m / meds[0]) for m in meds))
print("#  samples: " + " | ".join(a.strip() for a in sys.argv[2:]))
PY
  unset res
done
