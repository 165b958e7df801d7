#!/usr/bin/env bash
# The test suite against the NEWEST releases setup.py allows (no constraints.txt): for a scheduled "latest versions"
# job that warns early when a new transformers/diffusers/peft/... breaks something. Not CI: CI runs scripts/test.sh
# with the pinned set. Builds a throw-away venv (a few minutes), prints which versions differ from constraints.txt,
# runs pytest (extra arguments pass through) and removes the venv; MMGRPO_KEEP_VENV=1 keeps it.
# A failure here is a reason to update code or pins (rebuild, run the suite, refresh constraints.txt), not a CI break.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/mmgrpo-latest.XXXXXX")"
[ "${MMGRPO_KEEP_VENV:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
export MMGRPO_UNPINNED=1 MMGRPO_VENV="$tmp/venv"
# shellcheck disable=SC1091
source "$root/scripts/env.sh" || exit 1
echo "[test_latest] versions that differ from constraints.txt (pinned -> installed):" >&2
python - "$root/constraints.txt" <<'EOF' >&2
import re, sys
from importlib.metadata import distributions

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pins = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, ver = line.split("==")
        pins[norm(name)] = ver
for d in sorted(distributions(), key=lambda d: norm(d.metadata["Name"])):
    name = norm(d.metadata["Name"])
    if name != "mmgrpo" and pins.get(name) != d.version:
        print(f"  {name}: {pins.get(name, '(not pinned)')} -> {d.version}")
EOF
python -m pytest -q "$@"
