#!/usr/bin/env bash
# Video-R1 (T-GRPO) on Video-R1-260k multiple choice, Qwen2.5-VL-7B (configs/vlm/video_r1_tgrpo.yaml).
#   MODEL_DIR=Qwen2.5-VL-7B-SFT DATA_DIR=video_r1 OUT_DIR=runs/video_r1 NUM_GPUS=8 bash $0 [key=value ...] [-- ...]
#   (MODEL_DIR = the SFT cold-start model; the eval set: an MVBench-style JSONL, $DATA_DIR/mvbench.jsonl)
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic multiple-choice videos, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/video_r1_tgrpo.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/video_r1_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/mvbench.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/mvbench.jsonl" data.media_root="$DATA_DIR" data.prompt_template=video_r1 \
  out_dir="$OUT_DIR/eval_mvbench" \
  "${EVAL_ARGS[@]}"
