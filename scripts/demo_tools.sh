#!/usr/bin/env bash
# The look-again demo (issue #37 item 4): GRPO with the crop tool vs without, equal CPU budget, 3 seeds, on the CPU,
# no downloads. Writes runs/demo_tools/report.md, metrics.json and trajectory images. Extra arguments go to
# scripts/demo_tools.py (see --help), e.g. --seeds 0 --budget 60.
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" python scripts/demo_tools.py --out runs/demo_tools "$@"
