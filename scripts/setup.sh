#!/usr/bin/env bash
# One command from a fresh Debian 12 machine: install the dependencies, build,
# and run the demo job.
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
scripts/demo.sh
