#!/usr/bin/env bash
# The whole suite again and again on one commit, while a CPU hog holds core 0:
# how muster shows that no test is flaky on a loaded machine.
#   scripts/soak.sh [COMMIT] [RUNS] [DIR]    (HEAD, 5, /tmp/muster-soak)
#   scripts/soak.sh --here [RUNS]
# Each run is `.ci/run` as CI runs it (install script, normal and ASan+UBSan
# builds, every CTest suite two at a time, the fuzzers); the first failing run
# stops the soak. The first form soaks a fresh clone of COMMIT in DIR (its first
# run builds everything). --here soaks this checkout as it is committed (it
# refuses uncommitted changes) and brings its two builds up to date before the
# hog starts, so that every run's time goes to the tests. Progress, one line a
# run, goes to stdout; each run's output to DIR/runN.log (--here: soak/runN.log).
. "$(dirname "$0")/lib/help.sh"
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --here ]; then
  runs=${2:-5}
  cd "$repo" || exit 1
  if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
    echo "soak.sh: this checkout has uncommitted changes (git status); commit them or soak a clone" >&2
    exit 2
  fi
  logs=$repo/soak
  mkdir -p "$logs"
  scripts/build.sh normal > "$logs/build.log" 2>&1 && scripts/build.sh asan >> "$logs/build.log" 2>&1 \
    || { echo "soak.sh: the build failed: $logs/build.log" >&2; exit 1; }
else
  commit=${1:-HEAD}
  runs=${2:-5}
  logs=${3:-/tmp/muster-soak}
  rm -rf "$logs"
  git clone -q "$repo" "$logs" && cd "$logs" && git checkout -q "$commit" || exit 1
fi
taskset -c 0 sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog' EXIT
echo "$(date +%T) commit $(git rev-parse --short HEAD), CPU hog (pid $hog) on core 0"
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  CI=true bash .ci/run </dev/null >"$logs/run$i.log" 2>&1
  rc=$?
  echo "$(date +%T) run $i: exit $rc in $(($(date +%s) - start)) s;" \
    "$(grep -h 'tests passed\|executions in' "$logs/run$i.log" | tr '\n' ' ')"
  [ "$rc" = 0 ] || { echo "run $i failed: $logs/run$i.log"; exit 1; }
done
echo "$runs runs in a row passed"
