#!/usr/bin/env bash
# Adv-GRPO on SD3.5-Medium with the adversarial DINOv2 reward (configs/flow/adv_grpo_sd35_dino.yaml; docs/adv_grpo.md).
#   MODEL_DIR=stable-diffusion-3.5-medium DATA_DIR=adv_grpo/dataset OUT_DIR=runs/adv_grpo NUM_GPUS=8 \
#     bash $0 reward.kwargs='{adv_dino: {model_dir: DINOV2_DIR, image_size: 518, references: metadata}}' \
#     -- reward_kwargs='{dino_similarity: {model_dir: DINOV2_DIR, image_size: 518, references: metadata}}'
#   (DATA_DIR/pickscore/{train,test}.jsonl: one {"prompt": ..., "reference_images": [...]} per line)
#   SMOKE=1 bash $0      (CPU: tiny SD3, mini-GenEval prompts, a tiny random DINOv2 with the renderer's references)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/adv_grpo_sd35_dino.yaml multi_gpu model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/pickscore/train.jsonl" data.eval_path="$DATA_DIR/pickscore/test.jsonl" "${TRAIN_ARGS[@]}"
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$MODEL_DIR" lora="$LORA_FINAL" \
  prompts="$DATA_DIR/pickscore/test.jsonl" rewards='[dino_similarity]' images_per_prompt=1 \
  out_dir="$OUT_DIR/eval_dino_similarity" "${EVAL_ARGS[@]}"
