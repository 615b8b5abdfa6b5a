#!/usr/bin/env bash
# Sharded-training calibration on 4 or 8 GPUs of one host, in one go: DDP,
# ZeroRedundancyOptimizer, FSDP2 (ZeRO-2-like and ZeRO-3) for GPT-2 XL and
# LLaMA-style 3B and 7B models (scripts/gpu/calibrate_zero.py MULTI_CONFIGS,
# split fixed there), then vramfit's predictions against the measured per-GPU
# NVML peaks.
#
# Usage (from the repo root, on a machine with at least WORLD GPUs):
#   scripts/gpu/multi_gpu.sh WORLD [VRAMFIT_BINARY]     # WORLD: 4 or 8
# Writes $OUT/multi/h200xWORLD-zero.jsonl (one line per run),
# $OUT/multi/predict-xWORLD.json (`vramfit bench predict` on them) and
# $OUT/multi/log-xWORLD.txt; no new configuration starts after 420 s.
set -uo pipefail
world=${1:?usage: multi_gpu.sh WORLD [VRAMFIT_BINARY]}
vramfit=${2:-.dev-bin/vramfit}
out="${OUT:-out}/multi"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log="$out/log-x$world.txt"
{
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -12
} | tee "$log"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if (( gpus < world )); then
  echo "multi_gpu.sh: $world ranks need $world GPUs, this machine has $gpus" | tee -a "$log" >&2
  exit 2
fi
python3 -c "import pynvml" 2>/dev/null || { echo "pynvml (nvidia-ml-py) is required" >&2; exit 1; }
python3 "$(dirname "$0")/calibrate_zero.py" --world "$world" --out "$out" --deadline 420 --timeout 150 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
measured="$out/h200x$world-zero.jsonl"
if [[ -s $measured && -x $vramfit ]]; then
  "$vramfit" bench predict --measured "$measured" -o json > "$out/predict-x$world.json" 2>>"$log"
  echo "prediction vs measured per GPU (split fixed in calibrate_zero.py):" | tee -a "$log"
  "$vramfit" bench predict --measured "$measured" 2>&1 | tee -a "$log"
fi
ls -la "$out"
exit $rc
