#!/usr/bin/env bash
# Issue 17's figures, side by side in one run: raid5d over 4 remote members vs over 4 local
# files, and over 4 remote members with DELAY (5ms) added to every read and write (with one
# connection per member, and with --member-conns CONNS), in a lab of network namespaces like the
# e2e tests' (test/netns_test.go). Each member host runs three nbdkit file servers (--threads
# 64), one plain and two behind the delay filter (delay-read and delay-write; the kernel here
# has no sch_netem for `tc netem`), each on a file of its own in DIR; the raid5d host runs four
# daemons, over each set of remote members and over 4 local files in DIR (the same
# filesystem); the client host runs fio's nbd engine (test/fio/netns/bench.fio, one
# connection, queue depth IODEPTH) against each over a veth link, taking turns job by job.
#
#   sudo test/bench/netns.sh        (needs root: ip netns)
#
# Environment: ROUNDS (3; the table shows medians, each round starting with the next
# configuration), RUNTIME (seconds per job, 5), IODEPTH (32), MEMBER (member size, 128M), DELAY
# (5ms), CONNS (4), DIR (/dev/shm/raid5d-netns), RESULTS (a file to keep each round's figures
# in: CONFIG JOB bytes/s IOPS, a line per run of a job), RAID5D (a raid5d binary instead of
# building one), RAID5D_FLAGS (extra serve flags for the daemons), CREATE_FLAGS (extra create
# flags, e.g. --bitmap-region 64M: at MEMBER 128M the default region is one stripe),
# RAID5D_B (a second binary, e.g. one built from the commit before a change: every
# configuration runs with it too, on members of its own, taking turns with the first, and a
# third table gives RAID5D / RAID5D_B), JOBS (the jobs to run, of seqwrite-1M seqread-1M
# randread-4k randwrite-4k; all), CONFIGS (the configurations to run, of local remote delayed
# conns; all: a quicker A/B),
# PROFILE (a directory: each job's run is profiled with perf, on the daemon and, apart, on its
# member servers: `perf record -e cpu-clock -g` into CONFIG-JOB-{raid5d,members}.data, and
# perf stat's CPU time, system calls and context switches per MiB moved, in PROFILE/stat, with
# fio's CPU per MiB and each CPU's busy share over the job from /proc/stat: a run whose CPUs
# are all busy is bound by the machine, and the sum per MiB says whose CPU bounds it;
# PERF_EVENTS adds events to count, e.g. syscalls:sys_enter_readv; RECORD=0 leaves perf record
# out, for perf stat's counts alone at little cost: its system calls per MiB tell a round's mode,
# README issue 17), PIN (1: every nbdkit member
# server on CPU 1, every raid5d and fio on CPU 0, in the local configuration too, so that both
# columns give the array host and its client one core and the members another: a stand-in for
# member hosts with CPUs of their own. Not a full one: softirq work is charged to the CPU that
# runs it, and a veth delivers a packet into the receiving side's TCP stack on the sending CPU
# (the peer's backlog is processed in the sender's softirq), so TCP receive of the requests'
# data (writes) is paid on CPU 0 and of the replies' data (reads) on CPU 1 - on real hosts each
# host pays its own receive and a NIC its own interrupt; and the kernel's own threads, the page
# cache of the member files and the memory bus are still shared).
# Bounded: every fio runs RUNTIME seconds under
# a timeout; at the end every process in the lab's namespaces is killed by PID and the
# namespaces (and so their veths) are deleted by name.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
export RUNTIME=${RUNTIME:-5} IODEPTH=${IODEPTH:-32}
MEMBER=${MEMBER:-128M}
DELAY=${DELAY:-5ms}
CONNS=${CONNS:-4}
DIR=${DIR:-/dev/shm/raid5d-netns}
[[ -n ${PROFILE:-} ]] && { command -v perf >/dev/null || { echo "need perf for PROFILE"; exit 1; }; mkdir -p "$PROFILE"; }
for t in ip nbdkit fio python3; do command -v $t >/dev/null || { echo "need $t (make deps)"; exit 1; }; done
if [[ -z ${RAID5D:-} ]]; then
  go build -o bin/raid5d ./cmd/raid5d
  RAID5D=bin/raid5d
fi
RAID5D=$(realpath "$RAID5D")
bins=("$RAID5D") sfx=("") # the binaries, and the suffix of their configurations' names
if [[ -n ${RAID5D_B:-} ]]; then
  bins+=("$(realpath "$RAID5D_B")") sfx+=("-b")
fi
JOBFILE=$(realpath test/fio/netns/bench.fio)
hostcpu=() membercpu=() # PIN=1: taskset prefixes for the array host (and client) and for the members
if [[ ${PIN:-} == 1 ]]; then
  (($(nproc) >= 2)) || { echo "PIN=1 needs 2 CPUs"; exit 1; }
  hostcpu=(taskset -c 0) membercpu=(taskset -c 1)
fi

id=r5b-$$ # the lab's namespaces: r5b-PID-HOST; veths vPIDhK (hub end) and vPIDuK
hub=$id-raid
net=10.158
pids=()
daemons=()
cleanup() {
  set +e
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done # the daemons first, then their members
  for p in "${daemons[@]}"; do wait "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  for ns in $(ip netns list | awk '{print $1}' | grep "^$id-"); do
    for p in $(ip netns pids "$ns"); do kill -9 "$p" 2>/dev/null; done
    while [[ -n $(ip netns pids "$ns") ]]; do sleep 0.05; done
    ip netns del "$ns"
  done
  rm -rf "$DIR"
}
trap cleanup EXIT
rm -rf "$DIR"; mkdir -p "$DIR"
ip netns add "$hub"
ip -n "$hub" link set lo up
host() { # host NAME K: namespace $id-NAME, linked to the hub on $net.K.0/24 (hub .1, host .2)
  ip netns add "$id-$1"
  ip -n "$id-$1" link set lo up
  ip link add "v$$h$2" netns "$hub" type veth peer name "v$$u$2" netns "$id-$1"
  ip -n "$hub" addr add "$net.$2.1/24" dev "v$$h$2"
  ip -n "$id-$1" addr add "$net.$2.2/24" dev "v$$u$2"
  ip -n "$hub" link set "v$$h$2" up
  ip -n "$id-$1" link set "v$$u$2" up
}
up() { # up HOST PORT: wait until something on HOST (as seen from the hub) accepts on PORT
  for _ in $(seq 200); do
    ip netns exec "$hub" bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listening on $1:$2"; exit 1
}

host client 5
for k in 0 1 2 3; do host "m$k" $((k + 1)); done
declare -A port # configuration -> the port its daemon listens on
declare -A dpid mpids # configuration -> its daemon's PID, its member servers' PIDs (a,b,c,d)
for i in "${!bins[@]}"; do
  b=${sfx[$i]}
  remote=() delayed=() conns=()
  mpids[remote${sfx[$i]}]="" mpids[delayed${sfx[$i]}]="" mpids[conns${sfx[$i]}]=""
  for k in 0 1 2 3; do
    p=$((10809 + 3 * i))
    truncate -s "$MEMBER" "$DIR/m$k$b.img" "$DIR/d$k$b.img" "$DIR/e$k$b.img"
    ip netns exec "$id-m$k" "${membercpu[@]}" nbdkit --foreground --threads 64 --ipaddr "$net.$((k + 1)).2" --port $p file file="$DIR/m$k$b.img" 2>>"$DIR/nbdkit.log" &
    pids+=($!)
    mpids[remote$b]+="${mpids[remote$b]:+,}$!"
    for d in d:$((p + 1)):delayed e:$((p + 2)):conns; do
      IFS=: read -r f q c <<<"$d"
      ip netns exec "$id-m$k" "${membercpu[@]}" nbdkit --foreground --threads 64 --ipaddr "$net.$((k + 1)).2" --port "$q" --filter=delay \
        file file="$DIR/$f$k$b.img" delay-read="$DELAY" delay-write="$DELAY" 2>>"$DIR/nbdkit.log" &
      pids+=($!)
      mpids[$c$b]+="${mpids[$c$b]:+,}$!"
    done
    remote+=("nbd://$net.$((k + 1)).2:$p/m$k$b")
    delayed+=("nbd://$net.$((k + 1)).2:$((p + 1))/d$k$b")
    conns+=("nbd://$net.$((k + 1)).2:$((p + 2))/e$k$b")
  done
  for k in 0 1 2 3; do for q in $p $((p + 1)) $((p + 2)); do up "$net.$((k + 1)).2" $q; done; done
  for a in remote delayed conns; do
    declare -n ms=$a
    ip netns exec "$hub" "${bins[$i]}" create --chunk 64K ${CREATE_FLAGS:-} "${ms[@]}" >/dev/null
  done
  "${bins[$i]}" create --chunk 64K ${CREATE_FLAGS:-} --size "$MEMBER" "$DIR"/l{0..3}$b.img >/dev/null

  serve() { # serve CONFIG PORT MEMBER...: a daemon on the hub for the client
    local c=$1 lp=$2; shift 2
    ip netns exec "$hub" "${hostcpu[@]}" "${bins[$i]}" serve --listen "$net.5.1:$lp" --control "$DIR/$c.ctl" --log-level error \
      ${RAID5D_FLAGS:-} "$@" &
    daemons+=($!)
    dpid[$c]=$!
    port[$c]=$lp
    up "$net.5.1" "$lp"
  }
  p=$((10809 + 4 * i))
  serve "local$b" $p "$DIR"/l{0..3}$b.img
  serve "remote$b" $((p + 1)) "${remote[@]}"
  serve "delayed$b" $((p + 2)) "${delayed[@]}"
  serve "conns$b" $((p + 3)) --member-conns "$CONNS" "${conns[@]}"
done
results=$DIR/results
: >"$results"
run() { # run CONFIG URI JOB RW BS
  local out=$DIR/fio.json prof=()
  if [[ -n ${PROFILE:-} ]]; then # perf on the daemon and on its members, for the job's length
    local who=("raid5d:${dpid[$1]}") ev=cpu-clock,raw_syscalls:sys_enter,context-switches${PERF_EVENTS:+,$PERF_EVENTS}
    [[ -n ${mpids[$1]:-} ]] && who+=("members:${mpids[$1]}")
    for w in "${who[@]}"; do
      if [[ ${RECORD:-1} == 1 ]]; then
        timeout -s INT $((RUNTIME + 60)) perf record -q -e cpu-clock -g -o "$PROFILE/$1-$3-${w%%:*}.data" -p "${w#*:}" 2>/dev/null &
        prof+=($!)
      fi
      timeout -s INT $((RUNTIME + 60)) perf stat -x, -e $ev -o "$PROFILE/$1-$3-${w%%:*}.stat" -p "${w#*:}" &
      prof+=($!)
    done
  fi
  grep '^cpu' /proc/stat >"$DIR/cpu.before"
  NBD_URI=$2 RW=$4 BS=$5 timeout $((RUNTIME + 60)) ip netns exec "$id-client" "${hostcpu[@]}" \
    fio --output-format=json --output="$out" "$JOBFILE" >/dev/null
  grep '^cpu' /proc/stat >"$DIR/cpu.after"
  for p in "${prof[@]}"; do kill -INT "$p" 2>/dev/null; done
  for p in "${prof[@]}"; do wait "$p" 2>/dev/null || true; done
  python3 - "$out" "$1" "$3" "${PROFILE:-}" "$DIR/cpu.before" "$DIR/cpu.after" >>"$results" <<'PY'
import json, os, sys
out, config, job, prof, before, after = sys.argv[1:]
with open(out) as f:
    text = f.read()
j = json.loads(text[text.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
print(config, job, d["bw_bytes"], d["iops"])
if prof:
    mib = d["io_bytes"] / 2**20
    with open(os.path.join(prof, "stat"), "a") as st:
        for w in ("raid5d", "members"):
            path = os.path.join(prof, "%s-%s-%s.stat" % (config, job, w))
            if not os.path.exists(path):
                continue
            v = {}
            for line in open(path):
                f = line.strip().split(",")
                if len(f) > 2 and f[0] and f[0][0].isdigit():
                    v[f[2]] = float(f[0])
            st.write("%s %s %s: %.0f MiB, cpu %.0f us/MiB, syscalls %.1f/MiB, context switches %.1f/MiB\n" % (
                config, job, w, mib, v.get("cpu-clock", 0) * 1e3 / mib,
                v.get("raw_syscalls:sys_enter", 0) / mib, v.get("context-switches", 0) / mib))
            for e in sorted(set(v) - {"cpu-clock", "raw_syscalls:sys_enter", "context-switches"}):
                st.write("  %s %.1f/MiB\n" % (e, v[e] / mib))
        # fio's own CPU (its usr_cpu and sys_cpu are percent of one CPU over the job's runtime)
        # and the machine's: each CPU's busy share over the job from /proc/stat (softirq apart),
        # and every CPU's busy time per MiB (its busy share times the job's runtime), whoever
        # spent it
        fio = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1e3
        def ticks(path):
            return {l.split()[0]: [int(x) for x in l.split()[1:]] for l in open(path)}
        a, b = ticks(before), ticks(after)
        parts, busy_all = [], 0.0
        for c in sorted(k for k in b if k != "cpu"):
            dt = [y - x for x, y in zip(a[c], b[c])]
            total = sum(dt[:8])
            idle = dt[3] + dt[4] # idle, iowait
            parts.append("%s %.0f%% busy (softirq %.0f%%, steal %.0f%%)" % (
                c, 100 * (total - idle) / total, 100 * dt[6] / total, 100 * dt[7] / total))
            busy_all += (total - idle) / total * j["job_runtime"] / 1e3
        st.write("%s %s fio: cpu %.0f us/MiB; machine: %s; all CPUs %.0f us/MiB\n" % (
            config, job, fio * 1e6 / mib, ", ".join(parts), busy_all * 1e6 / mib))
PY
}
jobs=()
for spec in "seqwrite-1M write 1M" "seqread-1M read 1M" "randread-4k randread 4k" "randwrite-4k randwrite 4k"; do
  [[ " ${JOBS:-${spec%% *}} " == *" ${spec%% *} "* ]] && jobs+=("$spec")
done
all=()
for b in "${sfx[@]}"; do for c in ${CONFIGS:-local remote delayed conns}; do all+=("$c$b"); done; done
for round in $(seq "$ROUNDS"); do
  for spec in "${jobs[@]}"; do
    read -r job rw bs <<<"$spec"
    k=$((round % ${#all[@]}))
    configs=("${all[@]:$k}" "${all[@]:0:$k}")
    for c in "${configs[@]}"; do run "$c" "nbd://$net.5.1:${port[$c]}/" "$job" "$rw" "$bs"; done
  done
  echo "round $round done" >&2
done
if [[ -n ${RESULTS:-} ]]; then cp "$results" "$RESULTS"; fi
echo "raid5d over 4 nbdkit members on hosts of their own (netns, veth) vs over 4 local files ($DIR),"
echo "fio nbd engine on a client host, 1 connection, iodepth $IODEPTH, ${RUNTIME}s per job, medians of $ROUNDS;"
echo "latency: nbdkit's delay filter, $DELAY on every read and write of every member; load at the end: $(cut -d" " -f1-3 /proc/loadavg)"
[[ ${PIN:-} == 1 ]] && echo "PIN=1: members on CPU 1, raid5d and fio on CPU 0 (local files too)"
python3 - "$results" "$DELAY" "$CONNS" "${RAID5D_B:+$RAID5D_B}" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    config, job, bw, iops = line.split()
    rows.setdefault(job, {}).setdefault(config, []).append((float(bw), float(iops)))
delay, conns, other = sys.argv[2], sys.argv[3], sys.argv[4]
jobs = ["seqwrite-1M", "seqread-1M", "randread-4k", "randwrite-4k"]
med = {job: {c: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
             for c, v in rows.get(job, {}).items()} for job in jobs}
def fmt(job, v):
    if not v:
        return "-"
    return "%.0f MB/s" % (v[0] / 1e6) if job.endswith("1M") else "%.0f IOPS" % v[1]
def ratio(a, b):
    return "%.2f" % (a[1] / b[1]) if a and b and b[1] else "-"
for b in ([""] + (["-b"] if other else [])):
    if other:
        print("\n" + ("RAID5D_B (%s):" % other if b else "RAID5D:"))
    print("| job | local files | remote | remote / local | remote +%s | +%s / +0 | +%s, %s conns | / +0 |" % (delay, delay, delay, conns))
    print("|---|---|---|---|---|---|---|---|")
    for job in jobs:
        l, m, d, c = (med[job].get(k + b) for k in ("local", "remote", "delayed", "conns"))
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (job, fmt(job, l), fmt(job, m), ratio(m, l),
              fmt(job, d), ratio(d, m), fmt(job, c), ratio(c, m)))
if other:
    print("\nRAID5D / RAID5D_B, same configuration:")
    print("| job | local files | remote | remote +%s | +%s, %s conns |" % (delay, delay, conns))
    print("|---|---|---|---|---|")
    for job in jobs:
        print("| %s | %s |" % (job, " | ".join(ratio(med[job].get(k), med[job].get(k + "-b"))
              for k in ("local", "remote", "delayed", "conns"))))
PY
