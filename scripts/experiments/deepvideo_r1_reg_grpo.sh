#!/usr/bin/env bash
# DeepVideo-R1 (Reg-GRPO) on video multiple choice, Qwen2.5-VL-7B (configs/vlm/deepvideo_r1_reg_grpo.yaml).
#   MODEL_DIR=Qwen2.5-VL-7B-SFT DATA_DIR=mcq OUT_DIR=runs/reg_grpo NUM_GPUS=8 bash $0 [key=value ...] [-- ...]
#   (eval set: $DATA_DIR/mcq_test.jsonl, e.g. SEED-Bench-R1 validation in the canonical schema)
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic multiple-choice videos, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/deepvideo_r1_reg_grpo.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/mcq_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/mvbench.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/mcq_test.jsonl" data.media_root="$DATA_DIR" data.prompt_template=video_r1 \
  out_dir="$OUT_DIR/eval_mcq" \
  "${EVAL_ARGS[@]}"
