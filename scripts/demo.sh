#!/usr/bin/env bash
# The demo job: a PyTorch DDP training run (gloo, two workers) launched by muster.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d /tmp/muster-demo.XXXXXX)
echo "demo: muster --standalone --nproc-per-node=2 examples/pytorch/ddp_train.py $out"
PATH="$PWD/.venv/bin:$PATH" build/launcher/muster --standalone --nproc-per-node=2 \
  examples/pytorch/ddp_train.py "$out"
echo "demo: rank 0 saved $out/model.pt"
