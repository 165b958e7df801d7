#!/usr/bin/env bash
# Video-RTS: pure RL (no SFT cold start) on CG-Bench multiple choice, Qwen2.5-VL-7B (configs/vlm/video_rts.yaml),
# then its test-time sparse-to-dense frame scaling (rts.*) on an MVBench-style set.
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=video_rts OUT_DIR=runs/video_rts NUM_GPUS=8 bash $0 [key=value ...] [-- ...]
#   (the training set: $DATA_DIR/video_rts_train.jsonl; the eval set: $DATA_DIR/mvbench.jsonl)
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic multiple-choice videos, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/video_rts.yaml fsdp model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/video_rts_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/mvbench.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/mvbench.jsonl" data.media_root="$DATA_DIR" data.prompt_template=video_rts \
  out_dir="$OUT_DIR/eval_mvbench_rts" \
  rts.enabled=true rts.min_frames=32 rts.max_frames=64 rts.num_samples=5 decoding.greedy=false \
  "${EVAL_ARGS[@]}"
