#!/usr/bin/env bash
# Charades-STA evaluation of one checkpoint in think AND no-think mode, then a side-by-side of the two modes.
# Evaluate the base model with the same command: only same-harness numbers are comparable (published
# Qwen2.5-VL-7B Charades-STA baselines range from 29.0 to 43.6 mIoU with prompt and fps alone).
#   scripts/eval_charades.sh MODEL ANNOTATIONS.jsonl MEDIA_ROOT OUT_PREFIX [key=value ...]
#   e.g. scripts/eval_charades.sh ckpts/Qwen2.5-VL-7B data/charades_test.jsonl data/Charades_v1_480 runs/eval/charades_base
[ $# -ge 4 ] || { sed -n 2,5p "$0" >&2; exit 2; }
model=$(realpath -m "$1"); ann=$(realpath -m "$2"); media=$(realpath -m "$3"); out=$(realpath -m "$4"); shift 4
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
for mode in think no_think; do
  python eval/generate_vlm.py --config eval/configs/charades_sta.yaml model="$model" data.annotations="$ann" \
    data.media_root="$media" data.prompt_mode=$mode out_dir="${out}_${mode}" "$@"
done
python eval/compare.py "${out}_think" "${out}_no_think" --out "${out}_modes.md"
