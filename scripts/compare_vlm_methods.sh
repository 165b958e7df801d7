#!/usr/bin/env bash
# Every VLM GRPO method (GRPO, Dr.GRPO, DAPO, TempSamp-R1, Reg-GRPO, T-GRPO, SEED-GRPO, DAPO overlong reward,
# high-entropy-token training, GDPO, DeepVideo-R1 augmentation, hybrid CoT) on synthetic temporal grounding,
# equal CPU-time budget per run, 3 seeds. Table: runs/compare_vlm/results.md. Extra args go to compare_methods.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python scripts/compare_methods.py vlm --out runs/compare_vlm --seeds 0,1,2 --budget 60 "$@"
