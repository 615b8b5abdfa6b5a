#!/usr/bin/env bash
# On the GPU machine: measured sets run again for more optimizer steps, to
# see whether the caching allocator's reserve still grows after the third
# step (the predictions generate and capture three):
#
#   scripts/gpu/later_steps.sh OUT STEPS DEADLINE SET...
#
# Each SET (data/calibration/SET-predictions.jsonl packs its runs side by
# side) runs with `calibrate_libraries.py --steps STEPS`; every step's last
# phase records `reservedAfterStep`. No set starts after DEADLINE seconds.
# OUT gets SET.jsonl and SET.log for each.
set -uo pipefail
out=${1:?usage: later_steps.sh OUT STEPS DEADLINE SET...}
steps=${2:?STEPS}
deadline=${3:?DEADLINE}
shift 3
# shellcheck source=scripts/gpu/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
setup_run "$out"
start=$SECONDS
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
budget_gib=$((total_mib / 1024 - 30))
for s in "$@"; do
  left=$((deadline - (SECONDS - start)))
  if ((left < 30)); then
    echo "$s: not started, ${left}s left" | tee -a "$out/later-steps.log"
    continue
  fi
  python3 scripts/gpu/calibrate_libraries.py --set "$s" --no-repeats --steps "$steps" \
    --out "$work/$s" --predictions "data/calibration/$s-predictions.jsonl" \
    --budget-gib "$budget_gib" --timeout 160 --deadline "$left" >"$out/$s.log" 2>&1
  echo "$s: rc=$? after $((SECONDS - start))s" | tee -a "$out/later-steps.log"
  stem=$s
  [[ $s == validation ]] && stem=libraries
  cp "$work/$s/$stem.jsonl" "$out/$s.jsonl" 2>/dev/null
done
