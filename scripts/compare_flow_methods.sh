#!/usr/bin/env bash
# Every flow method recipe in configs/compare/flow/ (Flow-GRPO SDE/CPS, DanceGRPO (+ best-of-n), Fast/Mix window,
# MixGRPO-Flash, TP-GRPO, G2RPO, VGPO, DiffusionNFT, BranchGRPO, B2-DiffuRL, Pref-GRPO, Adv-GRPO) on mini-GenEval,
# equal CPU-time budget per run, 3 seeds. Table: runs/compare_flow/results.md. Extra args go to compare_methods.py
# (e.g. --methods flow_grpo_sde,nft --budget 60, the wave-2 tables of docs/results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python scripts/compare_methods.py flow --out runs/compare_flow --seeds 0,1,2 --budget 180 "$@"
