#!/usr/bin/env bash
# Install trtspec with its test dependencies into .venv and run the test suite.
# Models are downloaded/converted once into ~/.cache/trtspec (or $TRTSPEC_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
# System tools the tests use: Prometheus and promtool (Debian package).
./scripts/ci_setup.sh
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e '.[dev]'
# Every tests/**/test_*.py must be collected (pytest silently skips folders named build/).
python scripts/check_collected.py
python -m pytest -q "$@"
