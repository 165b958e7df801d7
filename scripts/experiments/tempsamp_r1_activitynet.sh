#!/usr/bin/env bash
# TempSamp-R1 on ActivityNet Captions, Qwen2.5-VL-7B (configs/vlm/tempsamp_r1_activitynet.yaml; docs/experiments.md).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=anet OUT_DIR=runs/tempsamp_anet NUM_GPUS=4 bash $0 [key=value ...] [-- ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic videos, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/tempsamp_r1_activitynet.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/anet_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/activitynet_captions.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/anet_val2.jsonl" data.media_root="$DATA_DIR" data.prompt_mode=no_think \
  data.prompt_template=tempsamp_r1 score.official_mode=tempsamp_r1 \
  out_dir="$OUT_DIR/eval_anet" "${EVAL_ARGS[@]}"
