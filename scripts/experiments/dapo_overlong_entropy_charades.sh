#!/usr/bin/env bash
# DAPO + soft overlong reward + top-20% entropy tokens on Charades-STA, Qwen2.5-VL-7B
# (configs/vlm/dapo_overlong_entropy_charades.yaml).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=charades OUT_DIR=runs/dapo_overlong_entropy_charades NUM_GPUS=8 \
#     bash $0 [train key=value ...] [-- eval key=value ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic data, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/dapo_overlong_entropy_charades.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/charades_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/charades_sta.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/charades_test.jsonl" data.media_root="$DATA_DIR" data.prompt_mode=think data.prompt_template=time_r1_eval \
  out_dir="$OUT_DIR/eval_charades_sta" "${EVAL_ARGS[@]}"
