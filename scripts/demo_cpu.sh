#!/usr/bin/env bash
# The main job: GRPO on both front-ends on built-in synthetic benchmarks, on the CPU, no downloads.
# Writes runs/demo/report.md and runs/demo/metrics.json. Extra arguments go to scripts/demo.py (see --help).
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
python scripts/demo.py --out runs/demo "$@"
