#!/usr/bin/env bash
# MGPO multi-turn grounding on V* / MME-RealWorld-style images, Qwen2.5-VL-7B (configs/vlm/mgpo_vstar.yaml;
# docs/tools.md): as released (xinyu1205/verl@mgpo): the JSON box -> crop from the source image -> the answer in
# \boxed{}, binary answer reward.
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=vstar OUT_DIR=runs/mgpo_vstar NUM_GPUS=8 bash $0 [key=value ...] [-- ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic coloured-square images, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/mgpo_vstar.yaml multi_gpu model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/vstar_mcq.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/test.jsonl" data.media_root="$DATA_DIR" data.prompt_template=mgpo \
  score.official_mode=mgpo out_dir="$OUT_DIR/eval_vstar" \
  "${EVAL_ARGS[@]}"
