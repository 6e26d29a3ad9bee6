#!/usr/bin/env bash
# The demo job: examples/ddp_linear, a C++ model trained data-parallel on two
# CPU workers with libmuster, launched by muster (no Python anywhere).
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d /tmp/muster-demo.XXXXXX)
echo "demo: muster --standalone --nproc-per-node=2 --no-python build/examples/ddp_linear/ddp_linear $out"
build/launcher/muster --standalone --nproc-per-node=2 --no-python build/examples/ddp_linear/ddp_linear "$out"
echo "demo: rank 0 saved $out/checkpoint.txt"
