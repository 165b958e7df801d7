#!/usr/bin/env bash
# Flow-GRPO-Fast (no CFG) on SD3.5-Medium with the PickScore reward (configs/flow/flow_grpo_fast_sd35_pickscore.yaml; docs/experiments.md).
#   MODEL_DIR=stable-diffusion-3.5-medium DATA_DIR=flow_grpo/dataset OUT_DIR=runs/fgrpo_fast NUM_GPUS=8 \
#     bash $0 reward.kwargs='{pickscore: {model_path: PICKSCORE_V1_DIR, processor_path: CLIP_H_DIR}}' \
#       -- reward_kwargs='{pickscore: {model_path: PICKSCORE_V1_DIR, processor_path: CLIP_H_DIR}}'
#   SMOKE=1 bash $0      (CPU: tiny SD3, mini-GenEval prompts and reward, 2 epochs)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/flow_grpo_fast_sd35_pickscore.yaml multi_gpu model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/pickscore/train.txt" data.eval_path="$DATA_DIR/pickscore/test.txt" "${TRAIN_ARGS[@]}"
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$MODEL_DIR" lora="$LORA_FINAL" \
  prompts="$DATA_DIR/pickscore/test.txt" rewards='[pickscore]' images_per_prompt=1 guidance_scale=1.0 cfg=false \
  out_dir="$OUT_DIR/eval_pickscore" "${EVAL_ARGS[@]}"
