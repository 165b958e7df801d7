#!/usr/bin/env bash
# Every VLM GRPO method (GRPO, Dr.GRPO, DAPO, TempSamp-R1, Reg-GRPO, T-GRPO, SEED-GRPO, NGRPO, DAPO overlong
# reward, high-entropy-token training, GDPO, DeepVideo-R1 augmentation, hybrid CoT) on synthetic temporal grounding
# (the demo's grounding benchmark and base), equal CPU-time budget per run, 3 seeds; TR-DPO reference sync needs
# full fine-tuning: add --recipes configs/compare/vlm_full --out runs/compare_vlm_full.
# Table: runs/compare_vlm/results.md. Extra args go to compare_methods.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python scripts/compare_methods.py vlm --out runs/compare_vlm --seeds 0,1,2 --budget 60 "$@"
