# Shared logic of scripts/experiments/<name>.sh (sourced, not run). An experiment script is a few calls:
#   train KIND RECIPE ACCEL_CONFIG [key=value ...]   # KIND = vlm | flow; ACCEL_CONFIG = a scripts/accelerate_configs name
#   export_vlm | assemble_pipeline                  # full fine-tuning: a model folder the eval harness loads
#   evaluate SCRIPT --config EVAL_CONFIG [key=value ...]   # the paired evaluation of the trained weights, the same
#                                                          # evaluation of the base (<out_dir>_base; EVAL_BASE=0 skips
#                                                          # it) and eval/compare.py's table (<out_dir>_compare.md)
# and passes "${TRAIN_ARGS[@]}" / "${EVAL_ARGS[@]}": the script's own arguments, `key=value ...` for training, then
# after a `--` the ones for the evaluation, e.g.
#   bash scripts/experiments/flow_grpo_sd35_pickscore.sh \
#       reward.kwargs='{pickscore: {model_path: /ckpt/PickScore_v1, processor_path: /ckpt/CLIP-ViT-H-14-laion2B-s32B-b79K}}' \
#       -- reward_kwargs='{pickscore: {model_path: /ckpt/PickScore_v1, processor_path: /ckpt/CLIP-ViT-H-14-laion2B-s32B-b79K}}'
#
# Real run: MODEL_DIR, DATA_DIR, OUT_DIR and NUM_GPUS must be set (a missing one is an error naming it). Training is
#   `accelerate launch --config_file scripts/accelerate_configs/ACCEL_CONFIG.yaml --num_processes $NUM_GPUS
#   -m mmgrpo.vlm.cli|flow_grpo.cli train --config RECIPE ...`; rewards the recipe names but this checkout lacks are
#   reported before anything starts. DRY_RUN=1 prints the commands without running them.
# Flow runs export the trained weights (lora_final / transformer_final) and, with ema.enabled, their EMA beside
#   them (*_ema); the evaluation reads the trained ones, WEIGHTS=ema the EMA.
# Arguments: key=value overrides of the training run, then `--` and key=value overrides of the evaluation.
# Smoke run (SMOKE=1): the same recipe on CPU in one process (plain python, no accelerate), with the model and data
#   swapped for the shipped tiny models and synthetic data and 2 steps (scripts/experiments/smoke.py says exactly what
#   changes; rewards that need downloaded weights become a tiny verifiable one); then the same export and eval
#   commands on a few synthetic samples. OUT_DIR defaults to runs/smoke/<name>.
# CPU rehearsal (PROFILE=cpu): the real run's commands on the real (depth-cut) model and data, in one process with
#   plain python (no accelerate; NUM_GPUS defaults to 1), with `--profile cpu` on training and evaluation: CPU device,
#   bf16, SDPA, 2 steps of 1 prompt x 4 rollouts, small media budgets, 2 evaluation samples (docs/experiments.md).
# Every command is printed before it runs. The active python environment is used (activate it first, e.g.
# `source scripts/env.sh`); set PYTHON / ACCELERATE to use other executables.
set -euo pipefail
EXP_NAME="$(basename "${BASH_SOURCE[1]}" .sh)"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
SMOKE="${SMOKE:-0}"
PROFILE="${PROFILE:-}"  # e.g. PROFILE=cpu: a CPU rehearsal (one process, no accelerate; mmgrpo/utils/profiles.py)

_die() { echo "[$EXP_NAME] ERROR: $*" >&2; exit 2; }

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the script's header, then these notes
  sed -n '2,/^source/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  sed -n '/^# Real run:/,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 0
fi

# the script's arguments: training overrides, then `--`, then evaluation overrides
TRAIN_ARGS=() EVAL_ARGS=()
_seen_sep=0
for _a in "$@"; do
  if [ "$_seen_sep" = 0 ] && [ "$_a" = "--" ]; then _seen_sep=1; continue; fi
  if [ "$_seen_sep" = 0 ]; then TRAIN_ARGS+=("$_a"); else EVAL_ARGS+=("$_a"); fi
done
for _a in "${TRAIN_ARGS[@]}" "${EVAL_ARGS[@]}"; do
  [[ "$_a" == *=* ]] || _die "arguments are key=value overrides (training, then -- and evaluation), got '$_a'"
done

_require_env() {
  local v missing=()
  for v in MODEL_DIR DATA_DIR OUT_DIR NUM_GPUS; do
    [ -n "${!v:-}" ] || missing+=("$v")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    _die "set ${missing[*]} (MODEL_DIR = base model folder, DATA_DIR = converted data, OUT_DIR = run folder,
  NUM_GPUS = processes; docs/experiments.md), or run the CPU smoke test: SMOKE=1 bash $0"
  fi
  [[ "$NUM_GPUS" =~ ^[1-9][0-9]*$ ]] || _die "NUM_GPUS must be a positive integer, got '$NUM_GPUS'"
  [ -d "$MODEL_DIR" ] || _die "MODEL_DIR=$MODEL_DIR is not a folder"
  [ -d "$DATA_DIR" ] || _die "DATA_DIR=$DATA_DIR is not a folder"
}

if [ "$SMOKE" = 1 ]; then
  # placeholders: the recipe's model / data arguments are replaced by smoke.py's overrides (a later key=value wins)
  OUT_DIR="${OUT_DIR:-runs/smoke/$EXP_NAME}"
  MODEL_DIR="<tiny model>" DATA_DIR="<synthetic data>" NUM_GPUS=1
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # tiny models: one thread is fastest on a shared CPU
else
  [ -z "$PROFILE" ] || NUM_GPUS="${NUM_GPUS:-1}"
  _require_env
fi
OUT_DIR="$(realpath -m "$OUT_DIR")"
# the flow weights the paired evaluation reads: the trained ones (lora_final / transformer_final), or with
# WEIGHTS=ema their EMA written beside them (lora_final_ema / transformer_final_ema; recipes with ema.enabled)
case "${WEIGHTS:-trained}" in
  trained) FINAL_SUFFIX="" ;;
  ema) FINAL_SUFFIX="_ema" ;;
  *) _die "WEIGHTS must be 'trained' (default) or 'ema', got '$WEIGHTS'" ;;
esac
LORA_FINAL="$OUT_DIR/lora_final$FINAL_SUFFIX"
_KIND="" _RECIPE=""

_show() {  # print a command as it can be pasted into a shell
  local out="" a
  for a in "$@"; do out+="$(printf '%q' "$a") "; done
  echo "[$EXP_NAME] \$ ${out% }" >&2
}

_run() {
  _show "$@"
  [ "${DRY_RUN:-0}" = 1 ] || "$@"
}

_smoke() {  # smoke.py SUBCOMMAND for the current recipe
  "$PYTHON" scripts/experiments/smoke.py "$1" "$_KIND" "$_RECIPE" "${@:2}"
}

_base() {  # the base model of the trained weights
  if [ "$SMOKE" = 1 ]; then _smoke base; else echo "$MODEL_DIR"; fi
}

train() {  # KIND RECIPE ACCEL_CONFIG [key=value ...]
  _KIND="$1" _RECIPE="$2"
  local accel="scripts/accelerate_configs/$3.yaml" module
  shift 3
  [ -f "$_RECIPE" ] || _die "recipe not found: $_RECIPE"
  [ -f "$accel" ] || _die "accelerate config not found: $accel"
  case "$_KIND" in vlm) module=mmgrpo.vlm.cli ;; flow) module=flow_grpo.cli ;; *) _die "unknown kind $_KIND" ;; esac
  local rc=0
  _smoke check "$@" || rc=$?  # the overrides load, the rewards exist, their settings are complete
  case "$rc" in
    0) ;;
    2) _die "a training override is wrong (above: the key, and a close match when there is one)" ;;
    1|3) if [ "$SMOKE" = 1 ] || { [ "$rc" = 3 ] && [ "${DRY_RUN:-0}" = 1 ]; }; then  # smoke swaps such rewards
         echo "[$EXP_NAME] note: a real run would stop here (above)" >&2
       elif [ "$rc" = 1 ]; then _die "the recipe names rewards this checkout does not provide (above); docs/experiments.md"
       else _die "a reward setting is missing or wrong (above); docs/experiments.md"; fi ;;
    *) _die "smoke.py check failed (exit $rc)" ;;
  esac
  if [ "$SMOKE" = 1 ]; then
    local -a smoke
    mapfile -t smoke < <(_smoke train "$OUT_DIR") || true
    [ ${#smoke[@]} -gt 0 ] || _die "smoke.py train produced no overrides"
    _run "$PYTHON" -m "$module" train --config "$_RECIPE" "$@" "${smoke[@]}"
  elif [ -n "$PROFILE" ]; then  # a rehearsal: one process, the profile's overrides before the script's own
    _run "$PYTHON" -m "$module" train --profile "$PROFILE" --config "$_RECIPE" run.output_dir="$OUT_DIR" "$@"
  else
    _run "${ACCELERATE:-accelerate}" launch --config_file "$accel" --num_processes "$NUM_GPUS" \
      -m "$module" train --config "$_RECIPE" run.output_dir="$OUT_DIR" "$@"
  fi
}

export_vlm() {  # $OUT_DIR/final = the base model + the newest full fine-tuning checkpoint
  _run "$PYTHON" scripts/experiments/export_vlm.py "$OUT_DIR" "$(_base)" "$OUT_DIR/final"
}

assemble_pipeline() {  # $OUT_DIR/pipeline_final = the base pipeline's components + the trained transformer_final
  local base dst="$OUT_DIR/pipeline_final" f tr="$OUT_DIR/transformer_final$FINAL_SUFFIX"
  base="$(realpath "$(_base)")"
  _show mkdir -p "$dst" "&&" ln -s "$base/<every component but transformer>" "$tr" "$dst/"
  [ "${DRY_RUN:-0}" = 1 ] && return 0
  [ -d "$tr" ] || _die "$tr not found (did training finish?$([ -n "$FINAL_SUFFIX" ] && echo " WEIGHTS=ema needs ema.enabled and at least ema.update_every optimizer steps"))"
  mkdir -p "$dst"
  for f in "$base"/*; do
    [ "$(basename "$f")" = transformer ] || ln -sfn "$f" "$dst/$(basename "$f")"
  done
  ln -sfn "$tr" "$dst/transformer"
}

evaluate() {  # SCRIPT --config EVAL_CONFIG [key=value ...]: the trained weights, then the base, then the comparison
  "$PYTHON" scripts/experiments/smoke.py check-eval "$@" \
    || _die "an evaluation override (after --) is wrong (above: the key, and a close match when there is one)"
  _evaluate_one trained "$@"
  [ "${EVAL_BASE:-1}" = 1 ] || return 0
  local a out=""
  for a in "$@"; do [[ "$a" != out_dir=* ]] || out="${a#out_dir=}"; done
  [ -n "$out" ] || _die "evaluate: no out_dir= argument (needed for the base evaluation)"
  _evaluate_one base "$@"
  _run "$PYTHON" eval/compare.py "${out}_base" "$out" --names base,trained --out "${out}_compare.md"
}

_as_base() {  # the same evaluation arguments for the base model: model= / pipeline= the base, no lora= / adapter=,
  local base a  # out_dir=X -> X_base; prints one argument per line
  base="$(_base)"
  for a in "$@"; do
    case "$a" in
      model=*) echo "model=$base" ;;
      pipeline=*) echo "pipeline=$base" ;;
      lora=*|adapter=*) ;;
      out_dir=*) echo "${a}_base" ;;
      *) echo "$a" ;;
    esac
  done
}

_evaluate_one() {  # trained|base SCRIPT --config EVAL_CONFIG [key=value ...]
  local which="$1"
  shift
  local -a args=("$@") smoke=()
  if [ "$SMOKE" = 1 ]; then
    mapfile -t smoke < <(_smoke eval "$OUT_DIR") || true
    [ ${#smoke[@]} -gt 0 ] || _die "smoke.py eval produced no overrides"
    args+=("${smoke[@]}")
  fi
  [ "$which" = trained ] || mapfile -t args < <(_as_base "${args[@]}")
  if [ -n "$PROFILE" ]; then
    _run "$PYTHON" "${args[0]}" --profile "$PROFILE" "${args[@]:1}"
  else
    _run "$PYTHON" "${args[@]}"
  fi
}
