#!/usr/bin/env bash
# The test suite (what CI runs). Installs the environment on first use. Arguments go to pytest;
# --full adds the opt-in `extended` tier (tests/conftest.py, pytest.ini).
set -euo pipefail  # env.sh restores the caller's options; these scripts stop at the first failure
source "$(dirname "$0")/env.sh"
python -m pytest -q "$@"
