#!/usr/bin/env bash
# VITAL / ParaVT-style frame requests (seek tool, PARA-GRPO structure-token format term, frame-budget randomisation)
# on long-video multiple choice, Qwen2.5-VL-7B (configs/vlm/vital_seek_longvideo.yaml; docs/tools.md).
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=lvb OUT_DIR=runs/vital_seek NUM_GPUS=8 bash $0 [key=value ...] [-- ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic videos, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/vital_seek_longvideo.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/longvideo_seek.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/lvb_val.jsonl" data.media_root="$DATA_DIR" out_dir="$OUT_DIR/eval_lvb_seek" \
  "${EVAL_ARGS[@]}"
