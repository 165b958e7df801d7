#!/usr/bin/env bash
# The built-in synthetic temporal-grounding benchmark: writes the videos if needed, evaluates MODEL on them.
# MODEL=tiny builds a random tiny Qwen2.5-VL first (a CPU smoke test of the whole harness; its scores are ~0).
#   scripts/eval_synthetic_tvg.sh MODEL|tiny [OUT_DIR] [key=value ...]
[ $# -ge 1 ] || { sed -n 2,4p "$0" >&2; exit 2; }
model=$1; out=$(realpath -m "${2:-runs/eval/synthetic_tvg}"); shift $(( $# >= 2 ? 2 : 1 ))
[ "$model" = tiny ] || model=$(realpath -m "$model")
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
data=${SYN_TVG_DIR:-runs/data/synthetic_tvg}
[ -f $data/eval.jsonl ] || python data/synthetic_tvg.py $data --n-train 64 --n-eval 16 --seed 0
if [ "$model" = tiny ]; then
  model=runs/tiny_qwen2_5_vl
  [ -f $model/config.json ] || python -c "from mmgrpo.vlm.models.tiny import save_tiny_model; save_tiny_model('$model')"
  set -- decoding.max_new_tokens=16 "$@"
fi
python eval/generate_vlm.py --config eval/configs/synthetic_tvg.yaml model="$model" \
  data.annotations=$data/eval.jsonl out_dir="$out" "$@"
