#!/usr/bin/env bash
# Flow-GRPO on SD3.5-Medium with the OCR reward (configs/flow/flow_grpo_sd35_ocr.yaml; docs/experiments.md).
#   MODEL_DIR=stable-diffusion-3.5-medium DATA_DIR=flow_grpo/dataset OUT_DIR=runs/fgrpo_ocr NUM_GPUS=8 \
#     bash $0 [train key=value ...] [-- eval key=value ...]
#   SMOKE=1 bash $0      (CPU: tiny SD3, mini-GenEval prompts and reward, 2 epochs)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/flow_grpo_sd35_ocr.yaml multi_gpu model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/ocr/train.txt" data.eval_path="$DATA_DIR/ocr/test.txt" "${TRAIN_ARGS[@]}"
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$MODEL_DIR" lora="$LORA_FINAL" \
  prompts="$DATA_DIR/ocr/test.txt" rewards='[ocr]' images_per_prompt=1 out_dir="$OUT_DIR/eval_ocr" "${EVAL_ARGS[@]}"
