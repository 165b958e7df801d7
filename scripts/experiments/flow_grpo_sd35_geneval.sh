#!/usr/bin/env bash
# Flow-GRPO on SD3.5-Medium with the GenEval reward (configs/flow/flow_grpo_sd35_geneval.yaml; docs/experiments.md).
#   MODEL_DIR=stable-diffusion-3.5-medium DATA_DIR=flow_grpo/dataset OUT_DIR=runs/fgrpo_geneval NUM_GPUS=8 \
#     bash $0 [train key=value ...] [-- eval key=value ...]       (needs the GenEval reward server on port 18085)
#   SMOKE=1 bash $0      (CPU: tiny SD3, mini-GenEval prompts and reward, 2 epochs)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/flow_grpo_sd35_geneval.yaml multi_gpu model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/geneval/train_metadata.jsonl" data.eval_path="$DATA_DIR/geneval/test_metadata.jsonl" \
  "${TRAIN_ARGS[@]}"
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$MODEL_DIR" lora="$LORA_FINAL" \
  prompts="$DATA_DIR/geneval/test_metadata.jsonl" rewards='[remote]' \
  reward_kwargs='{remote: {url: "http://127.0.0.1:18085/score"}}' out_dir="$OUT_DIR/eval_geneval" "${EVAL_ARGS[@]}"
