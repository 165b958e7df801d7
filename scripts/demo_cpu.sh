#!/usr/bin/env bash
# The main job: GRPO on both front-ends on built-in synthetic benchmarks, on the CPU, no downloads.
# Writes runs/demo/report.md and runs/demo/metrics.json. Settings: configs/demo/tvg.yaml and configs/demo/t2i.yaml;
# extra arguments go to scripts/demo.py (see --help), e.g. tvg.full.grpo.run.max_steps=60.
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
python scripts/demo.py --out runs/demo "$@"
