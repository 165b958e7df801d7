#!/usr/bin/env bash
# MixGRPO on FLUX.1-dev with HPS-v2.1, PickScore, ImageReward and CLIP (configs/flow/mixgrpo_flux.yaml).
#   MODEL_DIR=FLUX.1-dev DATA_DIR=hps_prompts OUT_DIR=runs/mixgrpo NUM_GPUS=32 bash $0 [key=value ...] [-- ...]
#   (full fine-tuning with FSDP; needs the rewards `hpsv2` and `imagereward`)
#   SMOKE=1 bash $0      (CPU: tiny FLUX, mini-GenEval prompts and reward, 2 iterations)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/mixgrpo_flux.yaml fsdp model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/train.txt" data.eval_path="$DATA_DIR/test.txt" "${TRAIN_ARGS[@]}"
assemble_pipeline
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$OUT_DIR/pipeline_final" \
  prompts="$DATA_DIR/test.txt" rewards='[hpsv2, pickscore, imagereward, clip_score]' images_per_prompt=1 \
  num_steps=28 guidance_scale=3.5 height=720 width=720 out_dir="$OUT_DIR/eval_multi" "${EVAL_ARGS[@]}"
