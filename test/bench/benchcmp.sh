#!/usr/bin/env bash
# Compare the Go benchmarks of the working tree against another ref, side by side.
#
#   test/bench/benchcmp.sh REF            (make benchcmp BASE=REF)
#
# REF is checked out in a temporary git worktree; the benchmark binaries of both trees are
# built once, then run alternately (base, new, base, new, ...) COUNT times with -benchmem, so
# that machine load hits both sides alike, and benchstat prints the comparison.
#
# Environment: COUNT (rounds, 6), BENCH (benchmark regexp, .), BENCH_PKGS (packages, the hot-path
# ones: ./parity ./stripe ./raid ./nbd), BENCHTIME (passed as -test.benchtime if set),
# OUT (directory for the raw outputs, a temporary one by default; kept when set).
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${1:?usage: benchcmp.sh REF}
COUNT=${COUNT:-6}
BENCH=${BENCH:-.}
BENCH_PKGS=${BENCH_PKGS:-./parity ./stripe ./raid ./nbd}
# benchstat from golang.org/x/perf, pinned; installed into bin/ on first use.
BENCHSTAT_VERSION=v0.0.0-20260908200009-22c9c6c9d4da
BENCHSTAT=$PWD/bin/benchstat
if [[ ! -x $BENCHSTAT ]]; then
  GOBIN=$PWD/bin go install "golang.org/x/perf/cmd/benchstat@$BENCHSTAT_VERSION"
fi

tmp=$(mktemp -d /tmp/raid5d-benchcmp.XXXXXX)
out=${OUT:-$tmp/out}
mkdir -p "$out"
cleanup() {
  git worktree remove --force "$tmp/base" 2>/dev/null || true
  if [[ -z ${OUT:-} ]]; then rm -rf "$tmp"; else rm -rf "$tmp/base" "$tmp/bin-base" "$tmp/bin-new"; fi
}
trap cleanup EXIT
git worktree add --detach --quiet "$tmp/base" "$REF"
echo "# base $(git -C "$tmp/base" rev-parse --short HEAD) ($REF), new: working tree at $(git rev-parse --short HEAD)$(git diff --quiet || echo ' + changes')"

# build SIDE DIR: compile each package's test binary of the tree at DIR into $tmp/bin-SIDE.
build() {
  mkdir -p "$tmp/bin-$1"
  for p in $BENCH_PKGS; do
    (cd "$2" && go test -c -o "$tmp/bin-$1/" "$p")
  done
}
build base "$tmp/base"
build new "$PWD"

# run SIDE DIR: one round of every package's benchmarks, appended to $out/SIDE.txt.
run() {
  for p in $BENCH_PKGS; do
    (cd "$2/$p" && "$tmp/bin-$1/$(basename "$p").test" -test.run '^$' -test.bench "$BENCH" \
       -test.benchmem ${BENCHTIME:+-test.benchtime "$BENCHTIME"}) >>"$out/$1.txt"
  done
}
: >"$out/base.txt"; : >"$out/new.txt"
for i in $(seq "$COUNT"); do
  echo "# round $i/$COUNT" >&2
  run base "$tmp/base"
  run new "$PWD"
done
"$BENCHSTAT" base="$out/base.txt" new="$out/new.txt"
