#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into build-fuzz/ and runs
# each: first on its regression inputs (fuzz/regressions/<name>: inputs that
# crashed or froze an earlier build), then fuzzing for SECONDS from the seed
# corpus (fuzz/corpus/<name>, copied so the repo's seeds stay as they are).
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (default 60 s; every target)
# Prints the executions run and the crashes found per target; exits 1 on a
# crash, whose input is left in build-fuzz/artifacts/.
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
case "$seconds" in
  '' | *[!0-9]*) echo "fuzz: SECONDS must be a whole number of seconds, not '$seconds' (scripts/fuzz.sh --help)" >&2; exit 2 ;;
esac
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(frames store_request sessions cli)
cmake=$(command -v /usr/bin/cmake || command -v cmake)
if ! command -v clang++ > /dev/null; then
  echo "fuzz: clang++ is missing (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
CC=clang CXX=clang++ "$cmake" -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUSTER_FUZZ=ON > /dev/null
"$cmake" --build build-fuzz -j "${MUSTER_JOBS:-2}" > /dev/null
mkdir -p build-fuzz/artifacts
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for name in "${targets[@]}"; do
  bin=build-fuzz/fuzz/fuzz_$name
  work=build-fuzz/corpus/$name
  mkdir -p "$work"
  cp -n fuzz/corpus/"$name"/* "$work"/ 2> /dev/null || true
  log=build-fuzz/fuzz_$name.log
  crashes=0
  if ls fuzz/regressions/"$name"/* > /dev/null 2>&1; then
    if ! "$bin" -timeout=20 fuzz/regressions/"$name"/* > "$log.regressions" 2>&1; then
      echo "fuzz $name: a regression input fails (see $log.regressions)"
      crashes=1
    fi
  fi
  if ! "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix=build-fuzz/artifacts/"$name"- "$work" > "$log" 2>&1; then
    crashes=$((crashes + 1))
    grep -E "^==[0-9]+==ERROR|SUMMARY|Test unit written" "$log" | head -5 || true
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "fuzz $name: ${runs:-0} executions in $seconds s, $crashes crashes"
  [ "$crashes" -eq 0 ] || status=1
done
exit $status
