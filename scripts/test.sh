#!/usr/bin/env bash
# The whole test suite: a normal build and an AddressSanitizer +
# UndefinedBehaviorSanitizer build, each running every unit, integration and
# compatibility test through CTest; then every libFuzzer target on its
# regression inputs and for MUSTER_FUZZ_SECONDS (default 30) each.
# CTest runs MUSTER_TEST_JOBS suites at a time (default 2): a suite spends most
# of its time waiting on timers and peers; suites that share a resource of the
# machine take turns (RESOURCE_LOCK in tests/CMakeLists.txt); the package and
# wheel builds and the exclusion suite run alone (RUN_SERIAL).
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest=$(command -v /usr/bin/ctest || command -v ctest)
status=0
for kind in normal asan; do
  dir=build; [ "$kind" = asan ] && dir=build-asan
  echo "=== $kind build ==="
  scripts/build.sh "$kind"
  echo "=== $kind tests ==="
  (cd "$dir" && "$ctest" --output-on-failure --timeout 1200 -j "${MUSTER_TEST_JOBS:-2}") || status=1
done
echo "=== fuzzing ==="
scripts/fuzz.sh "${MUSTER_FUZZ_SECONDS:-30}" || status=1
exit $status
