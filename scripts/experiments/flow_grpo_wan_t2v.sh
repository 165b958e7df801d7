#!/usr/bin/env bash
# Flow-GRPO-style text-to-video GRPO on Wan2.1-T2V-1.3B with a per-frame OCR reward
# (configs/flow/flow_grpo_wan_t2v.yaml; docs/experiments.md).
#   MODEL_DIR=Wan2.1-T2V-1.3B-Diffusers DATA_DIR=flow_grpo/dataset OUT_DIR=runs/fgrpo_wan_ocr NUM_GPUS=8 \
#     bash $0 [key=value ...] [-- ...]   (LoRA; needs the OCR reward `ocr`)
#   SMOKE=1 bash $0      (CPU: tiny Wan, 5 frames at 32 px, per-frame brightness, 2 epochs)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/flow_grpo_wan_t2v.yaml multi_gpu model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/ocr/train.txt" data.eval_path="$DATA_DIR/ocr/test.txt" "${TRAIN_ARGS[@]}"
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$MODEL_DIR" lora="$LORA_FINAL" \
  prompts="$DATA_DIR/ocr/test.txt" rewards='[video_per_frame]' reward_kwargs='{video_per_frame: {reward: ocr}}' \
  images_per_prompt=1 num_steps=50 guidance_scale=5.0 height=240 width=416 num_frames=33 \
  out_dir="$OUT_DIR/eval_ocr" "${EVAL_ARGS[@]}"
