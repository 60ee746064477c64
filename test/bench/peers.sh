#!/usr/bin/env bash
# Side-by-side fio figures: raid5d (4 members) against its peers (nbdkit's file plugin over one
# file on the same filesystem, nbdkit's null plugin as the transport ceiling, nbd-server if it
# is installed, go-nbd v0.3.2's own server and file backend (test/bench/gonbd)), same transport
# (loopback TCP), same fio job files (test/fio/peers/*.fio), one run. The servers run one at a
# time. Bounded: each job runs RUNTIME seconds under a timeout; every server started here is
# stopped by PID.
#
#   test/bench/peers.sh [DIR]      DIR defaults to /dev/shm/raid5d-bench
#
# Environment: RUNTIME (seconds per job, 8), MEMBER (member size, 512M), CHUNK (16K, so 48k is
# a full stripe), PORT (10911), JOBS (job names to run, default all), RAID5D (a raid5d binary
# to use instead of building one), RAID5D_FLAGS (extra serve flags), PEERS (default
# "nbdkit-file nbdkit-null nbd-server gonbd"; raid5d-b is raid5d again, on the same members, as
# the binary RAID5D_B (default RAID5D) with RAID5D_B_FLAGS: a before/after or flag comparison
# in one run), ROUNDS (1: each server runs every job once;
# more: that many rounds, the servers taking turns in each, each round starting with the next
# server, and the table shows medians — on a shared machine, load drifts over the minutes a
# round takes).
#
# Prints one table: per job and server MB/s, IOPS, p99 completion latency (µs), the server's
# CPU time per I/O (µs, user+system from /proc/PID/stat over the job, all threads and ended
# child processes), and
# raid5d's IOPS ratio to each peer.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-/dev/shm/raid5d-bench}
export RUNTIME=${RUNTIME:-8}
MEMBER=${MEMBER:-512M}
CHUNK=${CHUNK:-16K}
PORT=${PORT:-10911}
PEERS=${PEERS:-nbdkit-file nbdkit-null nbd-server gonbd}
ROUNDS=${ROUNDS:-1}
for t in fio nbdkit nbdinfo python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done

if [[ -z ${JOBS:-} ]]; then
  JOBS=$(cd test/fio/peers && ls *.fio | sed 's/\.fio$//' | sort | tr '\n' ' ')
fi
if [[ -z ${RAID5D:-} ]]; then
  go build -o bin/raid5d ./cmd/raid5d
  RAID5D=bin/raid5d
fi
if [[ " $PEERS " == *" gonbd "* ]]; then
  go build -o bin/gonbd ./test/bench/gonbd
fi
rm -rf "$DIR"; mkdir -p "$DIR"
"$RAID5D" create --chunk "$CHUNK" --size "$MEMBER" "$DIR"/m{0..3}.img >/dev/null
size=$(stat -c %s "$DIR/m0.img")
size=$((size * 3 - 3 * 1024 * 1024)) # at most the array's size; the jobs touch 256M
truncate -s "$size" "$DIR/peer.img"
results=$DIR/results
: >"$results"

pid=
stop() { # stop the server started last, by PID
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true # not our child when it daemonized (nbd-server): wait until gone
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    pid=
  fi
}
cleanup() { stop; rm -rf "$DIR"; }
trap cleanup EXIT

start() { # name: start that server on PORT, in the background, and wait until it answers at $uri
  uri=nbd://127.0.0.1:$PORT
  case $1 in
    raid5d) "$RAID5D" serve --listen 127.0.0.1:$PORT --control "$DIR/ctl.sock" --log-level warn \
              ${RAID5D_FLAGS:-} "$DIR"/m{0..3}.img & ;;
    raid5d-b) "${RAID5D_B:-$RAID5D}" serve --listen 127.0.0.1:$PORT --control "$DIR/ctl.sock" --log-level warn \
              ${RAID5D_B_FLAGS:-} "$DIR"/m{0..3}.img & ;;
    nbdkit-file) nbdkit --foreground --exit-with-parent --port $PORT --ipaddr 127.0.0.1 \
                   file "$DIR/peer.img" & ;;
    nbdkit-null) nbdkit --foreground --exit-with-parent --port $PORT --ipaddr 127.0.0.1 \
                   null size="$size" & ;;
    nbd-server) # -d would serve one connection only, so it daemonizes and its PID comes from
                # the pid file; it has no default export, so the URI names the export.
                printf '[generic]\n[peer]\nexportname = %s\n' "$DIR/peer.img" >"$DIR/nbd-server.conf"
                rm -f "$DIR/nbd-server.pid"
                nbd-server -C "$DIR/nbd-server.conf" -p "$DIR/nbd-server.pid" 127.0.0.1@$PORT 2>>"$DIR/nbd-server.log"
                uri=nbd://127.0.0.1:$PORT/peer ;;
    gonbd) bin/gonbd -listen 127.0.0.1:$PORT "$DIR/peer.img" & ;;
  esac
  if [[ $1 == nbd-server ]]; then pid=; else pid=$!; fi
  for _ in $(seq 100); do
    if [[ $1 == nbd-server ]]; then pid=$(cat "$DIR/nbd-server.pid" 2>/dev/null || true); fi
    [[ -n $pid ]] && nbdinfo --size "$uri" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "$1 did not start"; exit 1
}

# PARSE reads fio's JSON on stdin and prints one results line.
read -r -d '' PARSE <<'EOF' || true
import json, sys
server, job, t0, t1, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
p99 = d["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1e3
cpu = (t1 - t0) / hz * 1e6 / ios if ios else 0
print(job, server, "%.0f" % (d["bw_bytes"] / 1e6), "%.0f" % d["iops"], "%.0f" % p99, "%.1f" % cpu)
EOF

# cputicks PID: user+system ticks of PID and of its children that have ended (nbd-server forks
# one per connection), after waiting (bounded) for those children to end.
cputicks() {
  for _ in $(seq 50); do [[ -z $(pgrep -P "$1" || true) ]] && break; sleep 0.1; done
  awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat"
}

runjob() { # server job: append "job server MB/s IOPS p99us cpu-us/io" to results
  local t0 t1 out
  t0=$(cputicks "$pid")
  out=$(NBD_URI=$uri timeout $((RUNTIME + 60)) \
        fio --output-format=json "test/fio/peers/$2.fio" 2>/dev/null)
  t1=$(cputicks "$pid")
  python3 -c "$PARSE" "$1" "$2" "$t0" "$t1" "$(getconf CLK_TCK)" <<<"$out" >>"$results"
}

servers=(raid5d)
for p in $PEERS; do
  case $p in
    nbd-server) command -v nbd-server >/dev/null || { echo "# nbd-server not installed: skipped"; continue; } ;;
  esac
  servers+=("$p")
done
for round in $(seq "$ROUNDS"); do
  # Each round starts with the next server, so that none always runs first or last.
  k=$(( (round - 1) % ${#servers[@]} ))
  for s in "${servers[@]:k}" "${servers[@]:0:k}"; do
    start "$s"
    # Fill the range the jobs touch, so reads are of written data, not holes, and every server
    # is measured warm, in every round: a fresh raid5d's first stores into each page of its
    # members' mappings are slow on this project's VM (most likely the hypervisor's work for a
    # page first touched through a new mapping: the payload's readv and the parity ran about 10x
    # slower per byte; mincore and MADV_POPULATE_READ took under 0.1 s of it), so the first
    # 256M pass took 1.1-1.6 s against under 0.1 s warm, all 16 writes in flight answered
    # together every 60-120 ms: a job run first in a round paid it, the others did not.
    [[ $s == nbdkit-null ]] || timeout 60 fio --name=fill \
      --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size=256M >/dev/null
    for j in $JOBS; do runjob "$s" "$j"; done
    stop
  done
done

[[ $ROUNDS == 1 ]] || echo "# medians of $ROUNDS rounds (servers alternating within each round)"
python3 - "$results" "${servers[@]}" <<'EOF'
import statistics, sys
path, servers = sys.argv[1], sys.argv[2:]
runs = {}
for line in open(path):
    job, server, mbs, iops, p99, cpu = line.split()
    runs.setdefault(job, {}).setdefault(server, []).append((float(mbs), float(iops), float(p99), float(cpu)))
rows = {job: {s: tuple(statistics.median(col) for col in zip(*r)) for s, r in by.items()} for job, by in runs.items()}
peers = servers[1:]
head = "%-18s %-12s %9s %9s %9s %10s" % ("job", "server", "MB/s", "IOPS", "p99-us", "cpu-us/io")
head += "".join(" %15s" % ("vs-" + p) for p in peers)
print(head)
for job, by in rows.items():
    for s in servers:
        if s not in by:
            continue
        mbs, iops, p99, cpu = by[s]
        line = "%-18s %-12s %9.0f %9.0f %9.0f %10.1f" % (job, s, mbs, iops, p99, cpu)
        if s == "raid5d":
            line += "".join(" %15s" % ("%.2f" % (iops / by[p][1]) if by.get(p, (0, 0))[1] else "-") for p in peers)
        print(line)
EOF
