#!/usr/bin/env bash
# Mini-GenEval (held-out split, 4 images per prompt) for a diffusers pipeline, optionally with a trained LoRA.
# PIPELINE=tiny builds a random tiny SD3 pipeline (CPU smoke test: 64 px, 8 steps; its accuracy is ~0).
#   scripts/eval_t2i.sh PIPELINE|tiny [LORA_DIR|-] [OUT_DIR] [key=value ...]
#   e.g. scripts/eval_t2i.sh ckpts/sd3.5-medium runs/flow_grpo/checkpoints/epoch-00000100 runs/eval/t2i_grpo
[ $# -ge 1 ] || { sed -n 2,5p "$0" >&2; exit 2; }
pipe=$1; lora=${2:--}; out=$(realpath -m "${3:-runs/eval/t2i}"); shift $(( $# >= 3 ? 3 : $# ))
[ "$pipe" = tiny ] || pipe=$(realpath -m "$pipe")
[ "$lora" = - ] || lora=$(realpath -m "$lora")
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
prompts=${PROMPTS:-runs/data/mini_geneval_heldout.jsonl}
[ -f $prompts ] || { mkdir -p "$(dirname $prompts)"; python data/synthetic_t2i.py --all --split heldout --out $prompts; }
if [ "$pipe" = tiny ]; then
  pipe=runs/tiny_sd3
  [ -f $pipe/model_index.json ] || python -c "from flow_grpo.models import save_tiny_pipeline; save_tiny_pipeline('$pipe')"
  set -- height=64 width=64 num_steps=8 max_prompts=8 "$@"
fi
extra=(); [ "$lora" = - ] || extra=(lora="$lora")
python eval/generate_t2i.py --config eval/configs/mini_geneval.yaml pipeline="$pipe" "${extra[@]}" prompts=$prompts \
  rewards=mini_geneval,jpeg_compressibility out_dir="$out" "$@"
