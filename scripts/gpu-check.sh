#!/usr/bin/env bash
# The GPU check, for a machine with GPUs that has CMake, a C++ compiler, nvcc
# and PyTorch (CUDA build) with its NCCL wheel, but none of Debian's packages.
# Here, first: scripts/build.sh && scripts/gpu-deps.sh (makes .gpu-deps/,
# ~14 MB, carried to that machine beside the tree). There:
#   scripts/gpu-check.sh [PYTHON]     (PYTHON: one with CUDA torch; default python3)
# It builds muster with CUDA and NCCL against .gpu-deps into build-gpu/, runs
# the NCCL test (tests/integration/test_nccl.py), examples/ddp_cuda on every
# GPU, and bench/allreduce/nccl_run.py (libmuster's NCCL all_reduce beside
# torch's dist.all_reduce on NCCL), and --numa-binding in each mode (every
# worker's CPUs equal those torch's own rules give its GPU on this machine;
# tests/data/gpu_numa_check.py). Bounded: each step has a time limit, the
# whole fits in 8 minutes on a 16-core machine. Results go to stdout and, when
# $OUT is set, to $OUT/gpu-check.txt. Exit status: the first failing step's.
. "$(dirname "$0")/lib/help.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
deps=$PWD/.gpu-deps
TAG=gpu-check LOG=${OUT:+$OUT/gpu-check.txt}
. scripts/lib/steps.sh
[ -d "$deps/include/boost" ] || { say ".gpu-deps is missing: run scripts/gpu-deps.sh where Debian's packages are"; exit 1; }
nccl=$("$py" -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
[ -f "$nccl/include/nccl.h" ] || { say "no NCCL wheel in $py (pip install nvidia-nccl-cu13)"; exit 1; }
say "$(nproc) cores; nvcc: $(command -v nvcc || echo none); NCCL: $nccl"
command -v nvidia-smi > /dev/null && nvidia-smi -L | sed 's/^/gpu-check: /'
"$py" -c "import torch; print('gpu-check: torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
jobs=$(( $(nproc) > 16 ? 16 : $(nproc) ))
arch=x86_64-linux-gnu
run configure 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMUSTER_WITH_CUDA=ON \
  -DMUSTER_NCCL_ROOT="$nccl" -DMUSTER_PYTHON="$(command -v "$py")" \
  -DBoost_DIR="$deps/lib/$arch/cmake/Boost-1.81.0" -Dboost_headers_DIR="$deps/lib/$arch/cmake/boost_headers-1.81.0" \
  -Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json" -DCLI11_DIR="$deps/share/cmake/CLI11" \
  -DCatch2_DIR="$deps/lib/cmake/Catch2" -DOPENSSL_ROOT_DIR="$deps" -DOPENSSL_INCLUDE_DIR="$deps/include" \
  -DOPENSSL_CRYPTO_LIBRARY="$deps/lib/ossl/libcrypto.so" || exit $?
run build 300 cmake --build build-gpu -j "$jobs" --target muster musterd nccl_tool ddp_cuda nccl_bench || exit $?
export MUSTER_BIN=$PWD/build-gpu/launcher/muster MUSTERD_BIN=$PWD/build-gpu/rendezvous/musterd \
  MUSTER_NCCL_TOOL=$PWD/build-gpu/tests/nccl_tool PYTHON_EXEC=$(command -v "$py")
if "$py" -c "import pytest" 2>/dev/null; then
  run nccl-test 180 "$py" -m pytest -q -rs tests/integration/test_nccl.py || keep
else
  say "pytest is not installed for $py: running the NCCL tool directly"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  run nccl-tool 180 "$MUSTER_BIN" --standalone --nproc-per-node="$(( gpus > 4 ? 4 : (gpus > 0 ? gpus : 1) ))" \
    --no-python "$MUSTER_NCCL_TOOL" || keep
fi
ddp_out=$(mktemp -d)
trap 'rm -rf "$ddp_out"' EXIT
run ddp_cuda 120 "$MUSTER_BIN" --standalone --nproc-per-node=gpu --no-python build-gpu/examples/ddp_cuda/ddp_cuda \
  "$ddp_out" || keep
run numa-binding 120 "$py" tests/data/gpu_numa_check.py "$MUSTER_BIN" || keep
run nccl-bench 300 "$py" bench/allreduce/nccl_run.py --muster "$MUSTER_BIN" --bench build-gpu/bench/nccl_bench \
  --python "$(command -v "$py")" --timeout 140 || keep
say "done: exit $status"
exit "$status"
