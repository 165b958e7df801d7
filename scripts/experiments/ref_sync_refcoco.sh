#!/usr/bin/env bash
# GRPO with TR-DPO reference sync on RefCOCO, Qwen2.5-VL-7B (configs/vlm/ref_sync_refcoco.yaml); full
# fine-tuning with DDP (multi_gpu): the sync mixes whole tensors, so not FSDP.
#   MODEL_DIR=Qwen2.5-VL-7B-Instruct DATA_DIR=refcoco OUT_DIR=runs/ref_sync_refcoco NUM_GPUS=8 \
#     bash $0 [train key=value ...] [-- eval key=value ...]
#   SMOKE=1 bash $0      (CPU: tiny Qwen2.5-VL, synthetic data, 2 steps)
source "$(dirname "$0")/_common.sh"
train vlm configs/vlm/ref_sync_refcoco.yaml multi_gpu model.path="$MODEL_DIR" \
  data.train_file="$DATA_DIR/refcoco_train.jsonl" data.media_root="$DATA_DIR" "${TRAIN_ARGS[@]}"
export_vlm
evaluate eval/generate_vlm.py --config eval/configs/refcoco.yaml model="$OUT_DIR/final" \
  data.annotations="$DATA_DIR/refcoco_val.jsonl" data.media_root="$DATA_DIR" data.prompt_mode=think data.prompt_template=vlm_r1_rec \
  out_dir="$OUT_DIR/eval_refcoco" "${EVAL_ARGS[@]}"
