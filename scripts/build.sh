#!/usr/bin/env bash
# Builds muster. `scripts/build.sh` gives build/; `scripts/build.sh asan` gives
# build-asan/ with AddressSanitizer and UndefinedBehaviorSanitizer.
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-normal}
case "$kind" in
  normal) dir=build; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug -DMUSTER_SANITIZE=ON) ;;
  *) echo "usage: scripts/build.sh [normal|asan]" >&2; exit 2 ;;
esac
python_flag=()
if [ -x .venv/bin/python ]; then python_flag=(-DMUSTER_PYTHON="$PWD/.venv/bin/python"); fi
cmake=$(command -v /usr/bin/cmake || command -v cmake)
"$cmake" -S . -B "$dir" "${flags[@]}" "${python_flag[@]}" > /dev/null
"$cmake" --build "$dir" -j "${MUSTER_JOBS:-2}"
