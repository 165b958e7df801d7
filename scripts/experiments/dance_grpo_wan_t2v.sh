#!/usr/bin/env bash
# DanceGRPO-style text-to-video GRPO on Wan2.1-T2V with per-frame HPS-v2.1 (configs/flow/dance_grpo_wan_t2v.yaml;
# docs/experiments.md).
#   MODEL_DIR=Wan2.1-T2V-1.3B-Diffusers DATA_DIR=video_prompts OUT_DIR=runs/dance_wan NUM_GPUS=32 \
#     bash $0 reward.kwargs='{video_per_frame: {reward: hpsv2, aggregate: mean, frame_stride: 4,
#       reward_kwargs: {checkpoint: HPS_v2.1_compressed.pt}}}' [-- ...]   (full fine-tuning with FSDP)
#   SMOKE=1 bash $0      (CPU: tiny Wan, 5 frames at 32 px, per-frame brightness, 2 iterations)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/dance_grpo_wan_t2v.yaml fsdp model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/train.txt" data.eval_path="$DATA_DIR/test.txt" "${TRAIN_ARGS[@]}"
assemble_pipeline
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$OUT_DIR/pipeline_final" \
  prompts="$DATA_DIR/test.txt" rewards='[video_per_frame]' \
  reward_kwargs='{video_per_frame: {reward: hpsv2, aggregate: mean, frame_stride: 4}}' images_per_prompt=1 \
  num_steps=50 guidance_scale=5.0 height=480 width=480 num_frames=53 batch_size=1 out_dir="$OUT_DIR/eval_hps" \
  "${EVAL_ARGS[@]}"
