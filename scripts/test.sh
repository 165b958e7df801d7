#!/usr/bin/env bash
# The test suite (what CI runs). Installs the environment on first use.
source "$(dirname "$0")/env.sh"
python -m pytest -q "$@"
