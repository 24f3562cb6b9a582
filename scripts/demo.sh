#!/usr/bin/env bash
# Install trtspec into .venv and run the main job on the embedded demo pair
# (SmolLM2-135M-Instruct target + its INT8 draft, prepared once into ~/.cache/trtspec).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e .
trtspec models demo
for prompt in "Explain how photosynthesis works." "Write a short poem about the sea."; do
  echo "--- speculation off: $prompt"
  trtspec generate --local --demo --speculation off --max-tokens 64 --prompt "$prompt"
  echo "--- speculation on (k=5): $prompt"
  trtspec generate --local --demo --k 5 --max-tokens 64 --prompt "$prompt"
done
