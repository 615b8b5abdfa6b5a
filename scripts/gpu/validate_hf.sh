#!/usr/bin/env bash
# Fresh validation of the analytic `huggingFace` predictor on the GPU machine:
# the 14 `--set validation` cases of calibrate_libraries.py (shapes and
# combinations that are in no calibration case), each in a fresh process, 6
# side by side, then `vramfit bench predict` on them when .dev-bin/vramfit is
# there. Writes $OUT/predict/validation.jsonl and $OUT/predict/validation.log
# (this script's output); about 60-90 s of GPU time.
#
# Usage (from the repo root): scripts/gpu/validate_hf.sh
set -uo pipefail
out="${OUT:-out}/predict"
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
  python3 -c "import pynvml" 2>/dev/null || { echo "pynvml (nvidia-ml-py) is required"; exit 1; }
  python3 "$(dirname "$0")/calibrate_libraries.py" --set validation --no-repeats \
    --deadline 100 --out "$work"
  rc=$?
  cp "$work/libraries.jsonl" "$out/validation.jsonl"
  bin=.dev-bin/vramfit
  if [[ -x $bin ]]; then
    echo "== $bin bench predict --measured validation.jsonl"
    "$bin" bench predict --measured "$out/validation.jsonl" | grep -v '^\(fit\|holdout\):'
  else
    echo "no $bin: run 'vramfit bench predict --measured validation.jsonl' elsewhere"
  fi
  exit $rc
} 2>&1 | tee "$out/validation.log"
rc=${PIPESTATUS[0]}
rm -rf "$work"
exit "$rc"
