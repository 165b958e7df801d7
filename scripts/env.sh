#!/usr/bin/env bash
# Source this file: creates (or reuses) the project's virtualenv and activates it.
# The venv lives outside the clone and is keyed by a hash of setup.py + constraints.txt, so fresh clones on the same
# machine reuse it and a changed requirement or pin builds a new one. It installs `-e .[dev]` with
# `-c constraints.txt`: the exact versions the suite is run with. Override the location with MMGRPO_VENV=/path.
# MMGRPO_UNPINNED=1 installs the newest releases setup.py allows instead (no constraints; its own venv key, reused
# until setup.py changes: delete it for newer releases): scripts/test_latest.sh uses it, in a throw-away venv.
# Sourcing leaves the caller's shell options (set -e/-u/pipefail, ...) as they were, changes to the repository root
# and sets the offline variables below; a failed install prints an error and returns non-zero without activating
# anything (and without closing an interactive shell).

# Strict mode only where it cannot reach the caller's shell: the install runs in a subshell.
_mm_install() {  # <root> <venv> <pinned 0|1>
  set -euo pipefail
  local root="$1" venv="$2" pinned="$3" py="${PYTHON:-python3}"
  local -a pin=()
  [ "$pinned" = 1 ] && pin=(-c "$root/constraints.txt")
  echo "[env] creating $venv (first run: installs torch, transformers, diffusers, ...; a few minutes)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -U pip "${pin[@]}" >&2
  "$venv/bin/python" -m pip install -q -e "$root[dev]" "${pin[@]}" >&2
  touch "$venv/.mmgrpo-complete"
}

_mm_main() {
  local root pinned=1 key
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  [ "${MMGRPO_UNPINNED:-0}" = 1 ] && pinned=0
  if [ "$pinned" = 1 ]; then
    if [ ! -f "$root/constraints.txt" ]; then
      echo "[env] ERROR: $root/constraints.txt is missing (set MMGRPO_UNPINNED=1 to install unpinned)" >&2
      return 1
    fi
    key="$(cat "$root/setup.py" "$root/constraints.txt" | sha256sum | cut -c1-16)"
  else
    key="latest-$(sha256sum "$root/setup.py" | cut -c1-16)"
  fi
  MMGRPO_VENV="${MMGRPO_VENV:-$HOME/.cache/mmgrpo/venv-$key}"
  if [ ! -f "$MMGRPO_VENV/.mmgrpo-complete" ]; then
    # Not `if ! (...)`: bash ignores set -e inside a subshell that is an if/||/! condition.
    (_mm_install "$root" "$MMGRPO_VENV" "$pinned")
    # shellcheck disable=SC2181
    if [ $? -ne 0 ]; then
      echo "[env] ERROR: installing the virtualenv $MMGRPO_VENV failed (pip's message is above); nothing was" \
           "activated. Fix the cause and source scripts/env.sh again (it starts the install over)." >&2
      return 1
    fi
  else
    # Same requirements: only point the editable install at this checkout (fast, no downloads).
    "$MMGRPO_VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root" >/dev/null 2>&1 \
      || "$MMGRPO_VENV/bin/python" -m pip install -q --no-deps -e "$root" >&2 \
      || { echo "[env] ERROR: could not point $MMGRPO_VENV at $root (pip install --no-deps -e)" >&2; return 1; }
  fi
  # shellcheck disable=SC1091
  source "$MMGRPO_VENV/bin/activate" || { echo "[env] ERROR: cannot activate $MMGRPO_VENV" >&2; return 1; }
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  export FORCE_QWENVL_VIDEO_READER=decord WANDB_MODE="${WANDB_MODE:-disabled}"
  cd "$root" || return 1
}

# Save the caller's options, run with errexit off (failures are handled above and returned), then restore them.
_mm_old_opts="$(set +o)"
case $- in *e*) _mm_old_opts+=$'\nset -e' ;; esac  # $(...) runs with errexit cleared, so `set +o` misses it
set +e
_mm_main
_mm_rc=$?
eval "$_mm_old_opts"
unset -f _mm_install _mm_main
unset _mm_old_opts
if (return 0 2>/dev/null); then
  eval "unset _mm_rc; return $_mm_rc"  # sourced
else
  exit "$_mm_rc"                       # run as `bash scripts/env.sh`: install only
fi
