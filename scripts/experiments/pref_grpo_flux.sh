#!/usr/bin/env bash
# Pref-GRPO on FLUX.1-dev with a pairwise preference judge (configs/flow/pref_grpo_flux.yaml; docs/experiments.md).
#   MODEL_DIR=FLUX.1-dev DATA_DIR=unigenbench OUT_DIR=runs/pref_grpo NUM_GPUS=64 \
#     bash $0 reward.pairwise_scorer=PKG.MODULE:FACTORY [key=value ...] [-- ...]   (full fine-tuning with FSDP)
#   SMOKE=1 bash $0      (CPU: tiny FLUX, the built-in score comparator on mini-GenEval, 2 iterations)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/pref_grpo_flux.yaml fsdp model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/train.txt" data.eval_path="$DATA_DIR/test.txt" "${TRAIN_ARGS[@]}"
assemble_pipeline
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$OUT_DIR/pipeline_final" \
  prompts="$DATA_DIR/test.txt" rewards='[clip_score]' images_per_prompt=1 num_steps=28 guidance_scale=3.5 \
  height=720 width=720 out_dir="$OUT_DIR/eval" "${EVAL_ARGS[@]}"
