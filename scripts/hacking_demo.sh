#!/usr/bin/env bash
# Reward-hacking benchmark (docs/results.md, "Reward hacking"): Flow-GRPO on a hackable proxy of Mini-GenEval with
# and without each guardrail, 3 seeds, equal process-CPU budget. Extra args go to scripts/hacking_demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
nice -n 5 python scripts/hacking_demo.py --out runs/hacking --seeds 0,1,2 "$@"
