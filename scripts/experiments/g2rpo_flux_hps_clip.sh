#!/usr/bin/env bash
# G2RPO on FLUX.1-dev with HPS-v2.1 + CLIP (configs/flow/g2rpo_flux_hps_clip.yaml; LoRA, see the recipe).
#   MODEL_DIR=FLUX.1-dev DATA_DIR=hps_prompts OUT_DIR=runs/g2rpo NUM_GPUS=16 bash $0 [key=value ...] [-- ...]
#   (needs the HPS-v2.1 reward `hpsv2`)
#   SMOKE=1 bash $0      (CPU: tiny FLUX, mini-GenEval prompts and reward, 2 iterations)
source "$(dirname "$0")/_common.sh"
train flow configs/flow/g2rpo_flux_hps_clip.yaml multi_gpu model.pipeline_dir="$MODEL_DIR" \
  data.train_path="$DATA_DIR/train.txt" data.eval_path="$DATA_DIR/test.txt" "${TRAIN_ARGS[@]}"
evaluate eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$MODEL_DIR" lora="$LORA_FINAL" \
  prompts="$DATA_DIR/test.txt" rewards='[hpsv2, clip_score]' images_per_prompt=1 num_steps=28 guidance_scale=3.5 \
  height=720 width=720 out_dir="$OUT_DIR/eval_hps" "${EVAL_ARGS[@]}"
