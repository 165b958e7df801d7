#!/usr/bin/env bash
# Source this file: creates (or reuses) the project's virtualenv and activates it.
# The venv lives outside the clone and is keyed by a hash of setup.py, so fresh clones on the same machine reuse
# it; a changed setup.py builds a new one. Override the location with MMGRPO_VENV=/path.
set -euo pipefail
_mm_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_mm_hash="$(sha256sum "$_mm_root/setup.py" | cut -c1-16)"
_mm_py="${PYTHON:-python3}"
MMGRPO_VENV="${MMGRPO_VENV:-$HOME/.cache/mmgrpo/venv-$_mm_hash}"
if [ ! -f "$MMGRPO_VENV/.mmgrpo-complete" ]; then
  echo "[env] creating $MMGRPO_VENV (first run: installs torch, transformers, diffusers, ...; a few minutes)" >&2
  rm -rf "$MMGRPO_VENV"
  "$_mm_py" -m venv "$MMGRPO_VENV"
  "$MMGRPO_VENV/bin/python" -m pip install -q -U pip >&2
  "$MMGRPO_VENV/bin/python" -m pip install -q -e "$_mm_root[dev]" >&2
  touch "$MMGRPO_VENV/.mmgrpo-complete"
else
  # Same requirements: only point the editable install at this checkout (fast, no downloads).
  "$MMGRPO_VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$_mm_root" >/dev/null 2>&1 \
    || "$MMGRPO_VENV/bin/python" -m pip install -q --no-deps -e "$_mm_root" >&2
fi
# shellcheck disable=SC1091
source "$MMGRPO_VENV/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export FORCE_QWENVL_VIDEO_READER=decord WANDB_MODE="${WANDB_MODE:-disabled}"
cd "$_mm_root"
