#!/usr/bin/env bash
# VLM-R1 REC on RefCOCO/+/g, Qwen2.5-VL-7B (configs/vlm/vlm_r1_refcoco.yaml; docs/experiments.md).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=refcoco OUT_DIR=runs/vlm_r1 NUM_GPUS=8 bash $0 [key=value ...] [-- ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic boxes, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/vlm_r1_refcoco.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/refcoco_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/refcoco.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/refcoco_val.jsonl" data.media_root="$DATA_DIR" data.prompt_mode=think data.prompt_template=vlm_r1_rec \
  out_dir="$OUT_DIR/eval_refcoco" "${EVAL_ARGS[@]}"
