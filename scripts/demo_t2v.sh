#!/usr/bin/env bash
# The CPU text-to-video demo (issue #22): GRPO with the Mini-T2V motion verifier on the tiny Wan base
# data/checkpoints/tiny_t2v (a distractor in ~55 % of its clips), held-out prompts, ~4-6 min on 2 cores.
# Writes runs/demo_t2v/report.md (+ grid.png, report.json). Extra arguments go to scripts/demo_t2v.py (--help),
# e.g. --seed 1 --out runs/demo_t2v_s1.
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
python scripts/demo_t2v.py --out runs/demo_t2v "$@"
