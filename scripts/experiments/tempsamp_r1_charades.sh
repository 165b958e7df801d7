#!/usr/bin/env bash
# TempSamp-R1 on Charades-STA, Qwen2.5-VL-7B (configs/vlm/tempsamp_r1_charades.yaml; docs/experiments.md).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=charades OUT_DIR=runs/tempsamp_charades NUM_GPUS=4 \
#     bash $0 [train key=value ...] [-- eval key=value ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic videos, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/tempsamp_r1_charades.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/charades_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/charades_sta.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/charades_test.jsonl" data.media_root="$DATA_DIR" data.prompt_mode=no_think \
  data.prompt_template=tempsamp_r1 score.official_mode=tempsamp_r1 \
  out_dir="$OUT_DIR/eval_charades" "${EVAL_ARGS[@]}"
