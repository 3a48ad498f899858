#!/usr/bin/env bash
# Create .venv and install Strata with its test tools. Safe to run again (fast when already installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# The CPU build of torch: the pinned wheel where this machine has it, else the default index.
python -c "import torch" 2>/dev/null || pip install -q torch==2.13.0 || pip install -q torch
pip install -q -e ".[dev,train]"
