#!/usr/bin/env bash
# Every flow GRPO method (Flow-GRPO SDE/CPS, DanceGRPO, Fast/Mix window, TP-GRPO, G2RPO) on mini-GenEval,
# equal CPU-time budget per run, 3 seeds. Table: runs/compare_flow/results.md. Extra args go to compare_methods.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python scripts/compare_methods.py flow --out runs/compare_flow --seeds 0,1,2 --budget 180 "$@"
