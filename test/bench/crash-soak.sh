#!/usr/bin/env bash
# Crash soak: the CI crash loops (test/e2e_crash_test.go, test/e2e_powercut_test.go) run for
# many more rounds. Each round kills the daemon at a random moment under a verifying
# `raid5d bench`, restarts it, checks every block (bench --check), waits for the resync and
# checks that it covered only the bitmap's dirty regions; each loop ends with scrub check = 0
# mismatches. Four kinds, one after the other:
#   crash     SIGKILL of the daemon on plain member files (TestCrashLoop)
#   powercut  SIGKILL with every member faulty:PATH?volatile: a power cut (TestPowerCutLoop)
#   readd     SIGKILL during a re-add's resync under the load (TestCrashLoopReAdd)
#   churn-j   journal policy, SIGKILL while degraded or rebuilding (TestCrashLoopChurnJournal)
# Usage: test/bench/crash-soak.sh [ROUNDS]   (default 200 rounds of each kind)
# Bounded: each kind stops starting rounds after MINUTES (default 20) minutes, and go test's
# -timeout kills the lot at 4×MINUTES+10. SEED (default: random) picks the kill moments; it is
# printed, so a failure can be replayed with SEED=... ROUNDS=... Prints counts per kind.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-${ROUNDS:-200}}
MINUTES=${MINUTES:-20}
SEED=${SEED:-$(( (RANDOM << 15 | RANDOM) + 1 ))}
OUT=$(mktemp -t crash-soak.XXXXXX)
trap 'rm -f "$OUT"' EXIT
echo "crash soak: $ROUNDS rounds of each kind, at most $MINUTES min each, seed $SEED"
status=0
RAID5D_CRASH_ROUNDS=$ROUNDS RAID5D_CRASH_TIME=${MINUTES}m RAID5D_CRASH_SEED=$SEED \
  go test -count=1 -v -timeout $((4 * MINUTES + 10))m -run '^(TestCrashLoop|TestPowerCutLoop|TestCrashLoopReAdd|TestCrashLoopChurnJournal)$' ./test >"$OUT" 2>&1 || status=$?
printf '%-9s %-6s %s\n' kind result counts
for kind in crash:TestCrashLoop powercut:TestPowerCutLoop readd:TestCrashLoopReAdd churn-j:TestCrashLoopChurnJournal; do
  name=${kind%%:*} test=${kind#*:}
  result=$(grep -oE -- "--- (PASS|FAIL|SKIP): $test " "$OUT" | awk '{print $2}' | tr -d : || true)
  counts=$(awk -v t="$test" '$0 ~ "^=== RUN +"t"$" {on=1; next} /^(=== RUN|--- )/ {on=0} on && /crashes,/ {sub(/^ *[^ ]+: /, ""); print}' "$OUT")
  printf '%-9s %-6s %s\n' "$name" "${result:-?}" "${counts:--}"
done
if [ "$status" -ne 0 ]; then
  echo "go test failed (exit $status); its output:"
  cat "$OUT"
fi
exit "$status"
