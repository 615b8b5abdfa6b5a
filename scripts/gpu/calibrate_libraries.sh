#!/usr/bin/env bash
# Library calibration on the GPU machine, in one go: transformers and
# torchvision models trained as their docs show, each case in a fresh process,
# several side by side. Writes $OUT/predict/libraries.jsonl and
# $OUT/predict/profiles.jsonl; prints a summary at the end.
#
# Usage (from the repo root): scripts/gpu/calibrate_libraries.sh [extra args]
set -uo pipefail
out="${OUT:-out}/predict"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
python3 -c "import pynvml" 2>/dev/null || { echo "pynvml (nvidia-ml-py) is required" >&2; exit 1; }
python3 "$(dirname "$0")/calibrate_libraries.py" --out "$out" "$@"
rc=$?
ls -la "$out"
exit $rc
