# Shared logic of scripts/experiments/<name>.sh (sourced, not run). Each experiment script calls:
#   train KIND RECIPE ACCEL_CONFIG [key=value ...]   # KIND = vlm | flow; ACCEL_CONFIG = a scripts/accelerate_configs name
#   export_vlm                                       # VLM full fine-tuning: $OUT_DIR/final for the eval harness
#   evaluate SCRIPT --config EVAL_CONFIG [key=value ...]
#
# Real run: MODEL_DIR, DATA_DIR, OUT_DIR and NUM_GPUS must be set (a missing one is an error naming it);
#   `accelerate launch --config_file scripts/accelerate_configs/ACCEL_CONFIG.yaml --num_processes $NUM_GPUS
#   -m mmgrpo.cli|flow_grpo.cli train --config RECIPE ...`, then the paired evaluation of $OUT_DIR's weights.
#   DRY_RUN=1 prints both commands without running them. Extra arguments of the experiment script are key=value
#   overrides appended to the training command (e.g. run.max_steps=10, reward.kwargs='{pickscore: {path: ...}}').
# Smoke run (SMOKE=1): the same recipe on CPU in one process (plain python, no accelerate) with only the model and
#   data swapped for the shipped tiny models and synthetic data, 2 steps (scripts/experiments/smoke.py says exactly
#   what changes); rewards that need downloaded weights are replaced by a tiny verifiable one. OUT_DIR defaults to
#   runs/smoke/<name>.
# Every command is printed before it runs. The active python environment is used (activate it first, e.g.
# `source scripts/env.sh`); set PYTHON / ACCELERATE to use other executables.
set -euo pipefail
EXP_NAME="$(basename "${BASH_SOURCE[1]}" .sh)"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
SMOKE="${SMOKE:-0}"

_die() { echo "[$EXP_NAME] ERROR: $*" >&2; exit 2; }

_require_env() {
  local v missing=()
  for v in MODEL_DIR DATA_DIR OUT_DIR NUM_GPUS; do
    [ -n "${!v:-}" ] || missing+=("$v")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    _die "set ${missing[*]} (MODEL_DIR = base model folder, DATA_DIR = converted data, OUT_DIR = run folder,
  NUM_GPUS = processes), or run the CPU smoke test: SMOKE=1 bash $0  (see docs/experiments.md)"
  fi
  [[ "$NUM_GPUS" =~ ^[1-9][0-9]*$ ]] || _die "NUM_GPUS must be a positive integer, got '$NUM_GPUS'"
  [ -d "$MODEL_DIR" ] || _die "MODEL_DIR=$MODEL_DIR is not a folder"
  [ -d "$DATA_DIR" ] || _die "DATA_DIR=$DATA_DIR is not a folder"
}

if [ "$SMOKE" = 1 ]; then
  # placeholders: the recipe's path arguments are replaced by smoke.py's overrides (later key=value wins)
  OUT_DIR="${OUT_DIR:-runs/smoke/$EXP_NAME}"
  MODEL_DIR="<tiny model>" DATA_DIR="<synthetic data>" NUM_GPUS=1
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # tiny models: one thread is fastest on a shared CPU
else
  _require_env
fi
OUT_DIR="$(realpath -m "$OUT_DIR")"
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

_smoke_overrides() {  # train|eval -> one override per line
  "$PYTHON" scripts/experiments/smoke.py "$1" "$_KIND" "$_RECIPE" "$OUT_DIR"
}

train() {  # KIND RECIPE ACCEL_CONFIG [key=value ...]
  _KIND="$1" _RECIPE="$2"
  local accel="scripts/accelerate_configs/$3.yaml" module
  shift 3
  [ -f "$_RECIPE" ] || _die "recipe not found: $_RECIPE"
  [ -f "$accel" ] || _die "accelerate config not found: $accel"
  case "$_KIND" in vlm) module=mmgrpo.cli ;; flow) module=flow_grpo.cli ;; *) _die "unknown kind $_KIND" ;; esac
  if [ "$SMOKE" = 1 ]; then
    local -a smoke
    mapfile -t smoke < <(_smoke_overrides train) || true
    [ ${#smoke[@]} -gt 0 ] || _die "smoke.py train produced no overrides"
    _run "$PYTHON" -m "$module" train --config "$_RECIPE" "$@" "${smoke[@]}"
  else
    "$PYTHON" scripts/experiments/smoke.py check "$_KIND" "$_RECIPE" "$@" \
      || _die "the recipe names rewards this checkout does not provide (above); see docs/experiments.md"
    _run "${ACCELERATE:-accelerate}" launch --config_file "$accel" --num_processes "$NUM_GPUS" \
      -m "$module" train --config "$_RECIPE" run.output_dir="$OUT_DIR" "$@"
  fi
}

export_vlm() {  # $OUT_DIR/final = base model + the newest full fine-tuning checkpoint (what the eval harness loads)
  local base="$MODEL_DIR"
  [ "$SMOKE" = 1 ] && base="$REPO/data/checkpoints/tiny_vlm"
  _run "$PYTHON" scripts/experiments/export_vlm.py "$OUT_DIR" "$base" "$OUT_DIR/final"
}

evaluate() {  # SCRIPT --config EVAL_CONFIG [key=value ...]: the paired evaluation of the trained weights
  if [ "$SMOKE" = 1 ]; then
    local -a smoke
    mapfile -t smoke < <(_smoke_overrides eval) || true
    [ ${#smoke[@]} -gt 0 ] || _die "smoke.py eval produced no overrides"
    _run "$PYTHON" "$@" "${smoke[@]}"
  else
    _run "$PYTHON" "$@"
  fi
}
