#!/usr/bin/env bash
# On the GPU machine: measure the held-out and families library sets again with
# every case's allocation history recorded (calibrate_libraries.py --snapshots:
# the real allocator's segments and segment events beside each run's tensor
# sequence), and capture both sets' CPU profiles there with the repository's
# vramfit.profile, on 4 CPUs of their own, beside the GPU runs.
#
#   scripts/gpu/allocator_snapshots.sh OUT
#
# OUT gets: heldout.jsonl, families.jsonl (the runs), *-profiles.jsonl.gz (the
# snapshots as profiles with their `allocator` views), the logs, and
# captures.tgz (the CPU captures, one folder per set).
set -uo pipefail
out=${1:?usage: allocator_snapshots.sh OUT}
# shellcheck source=scripts/gpu/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
setup_run "$out"
gpu_cpus=0-$((ncpu - 5))

capture() { # SET ROWS CPUS
  PYTHONPATH=python taskset -c "$3" python3 scripts/capture_library_profiles.py "$2" "$work/captures/$1" \
    >"$out/capture-$1.log" 2>&1
  echo "capture $1 rc=$?" >>"$out/capture-$1.log"
}
capture heldout data/calibration/heldout-cases.jsonl $((ncpu - 2)),$((ncpu - 1)) &
capture families data/calibration/h200-families.jsonl $((ncpu - 4)),$((ncpu - 3)) &

taskset -c "$gpu_cpus" python3 scripts/gpu/calibrate_libraries.py --set heldout --snapshots --out "$work/runs" \
  --predictions data/calibration/heldout-predictions.jsonl --budget-gib 118 --timeout 150 --deadline 200 \
  2>&1 | tee "$out/heldout-run.log"
taskset -c "$gpu_cpus" python3 scripts/gpu/calibrate_libraries.py --set families --snapshots --out "$work/runs" \
  --timeout 150 --deadline 200 2>&1 | tee "$out/families-run.log"
wait
cp "$work/runs/heldout.jsonl" "$work/runs/families.jsonl" "$out/"
for f in "$work"/runs/*-profiles.jsonl; do gzip -9c "$f" >"$out/$(basename "$f").gz"; done
tar -C "$work" -czf "$out/captures.tgz" captures
ls -l "$out"
