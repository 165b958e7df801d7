#!/usr/bin/env bash
# GPU acceptance check (issue #36; docs/gpu_check.md): one command, <= 8 minutes on one H200, report in OUT_DIR.
#
#   bash scripts/gpu_check.sh OUT_DIR [--dry-run] [--deadline S] [--only a,b] [--skip a,b] [--budget name=S] ...
#
# On the GPU machine (no network): installs the wheels of scripts/gpu_wheels.txt from .gpu_wheels/ (made here by
# `python scripts/gpu_wheels.py download`, carried there) into a scratch folder with pip --no-index, then runs
# `python -m eval.gpu_check OUT_DIR ...` (python -m eval.gpu_check --help lists the options). The deadline counts
# from this script's start. --dry-run: CPU, tiny widths, no install (what tests/eval/test_gpu_check.py runs).
# Environment: PYTHON (default python3), MMGRPO_GPU_WHEELS (default REPO/.gpu_wheels), MMGRPO_GPU_SITE (install
# target, default $TMPDIR/mmgrpo_gpu_site).
set -uo pipefail
T0=$(date +%s)
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
    echo "usage: bash scripts/gpu_check.sh OUT_DIR [--dry-run] [runner options: python -m eval.gpu_check --help]" >&2
    exit 2
fi
OUT=$1
shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
DRY=0
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY=1; done
if [ "$DRY" = 0 ]; then
    WHEELS=${MMGRPO_GPU_WHEELS:-$REPO/.gpu_wheels}
    SITE=${MMGRPO_GPU_SITE:-${TMPDIR:-/tmp}/mmgrpo_gpu_site}
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "gpu_check: installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE (no network)"
        if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
                "$WHEELS"/*.whl >>"$OUT/gpu_check.log" 2>&1; then
            echo "gpu_check: wheel install failed (see $OUT/gpu_check.log); sections that need them will record it" >&2
        fi
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu_check: no wheels in $WHEELS (python scripts/gpu_wheels.py download, then carry .gpu_wheels):" \
             "sections that need diffusers / trl will record their import errors" >&2
    fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
cd "$REPO" || exit 2
exec "$PY" -m eval.gpu_check "$OUT" --t0 "$T0" "$@"
