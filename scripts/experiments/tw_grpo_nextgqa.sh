#!/usr/bin/env bash
# TW-GRPO on NExT-GQA, Qwen2.5-VL-7B (configs/vlm/tw_grpo_nextgqa.yaml; docs/experiments.md).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=nextgqa OUT_DIR=runs/tw_grpo NUM_GPUS=2 bash $0 [key=value ...] [-- ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic grounded QA, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/tw_grpo_nextgqa.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/nextgqa_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/nextgqa.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/nextgqa_test.jsonl" data.media_root="$DATA_DIR" data.prompt_template=tw_grpo_mixed \
  out_dir="$OUT_DIR/eval_nextgqa" \
  "${EVAL_ARGS[@]}"
