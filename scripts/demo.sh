#!/usr/bin/env bash
# Install trtspec into .venv and run the main job on the embedded demo pair
# (SmolLM2-135M-Instruct target + its INT4 draft, INT8 where int4 would not pay; prepared once into ~/.cache/trtspec):
# build -> serve on a real tritonserver -> requests with speculation off and auto ->
# text and stats -> shut down. Extra arguments go to `trtspec demo` (e.g. --json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e .
exec trtspec demo "$@"
