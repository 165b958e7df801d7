#!/usr/bin/env bash
# SEED-GRPO on NExT-GQA QA, Qwen2.5-VL-7B (configs/vlm/seed_grpo_nextgqa.yaml).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=nextgqa OUT_DIR=runs/seed_grpo_nextgqa NUM_GPUS=8 \
#     bash $0 [train key=value ...] [-- eval key=value ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic data, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/seed_grpo_nextgqa.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/nextgqa_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/nextgqa.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/nextgqa_test.jsonl" data.media_root="$DATA_DIR" data.prompt_mode=think data.prompt_template=videochat_r1_gqa \
  out_dir="$OUT_DIR/eval_nextgqa" "${EVAL_ARGS[@]}"
