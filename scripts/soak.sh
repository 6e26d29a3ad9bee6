#!/usr/bin/env bash
# The whole suite again and again on one clean clone of one commit, while a CPU
# hog holds core 0: how muster shows that no test is flaky on a loaded machine.
#   scripts/soak.sh [COMMIT] [RUNS] [DIR]    (HEAD, 5, /tmp/muster-soak)
# Each run is `.ci/run` as CI runs it (install script, normal and ASan+UBSan
# builds, every CTest suite, the fuzzers); the first failing run stops the soak.
# Progress, one line a run, goes to stdout; each run's output to DIR/runN.log.
. "$(dirname "$0")/lib/help.sh"
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=${1:-HEAD}
runs=${2:-5}
dir=${3:-/tmp/muster-soak}
rm -rf "$dir"
git clone -q "$repo" "$dir" && cd "$dir" && git checkout -q "$commit" || exit 1
taskset -c 0 sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog' EXIT
echo "$(date +%T) commit $(git rev-parse --short HEAD), CPU hog (pid $hog) on core 0"
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  CI=true bash .ci/run </dev/null >"run$i.log" 2>&1
  rc=$?
  echo "$(date +%T) run $i: exit $rc in $(($(date +%s) - start)) s;" \
    "$(grep -h 'tests passed\|executions in' "run$i.log" | tr '\n' ' ')"
  [ "$rc" = 0 ] || { echo "run $i failed: $dir/run$i.log"; exit 1; }
done
echo "$runs runs in a row passed"
