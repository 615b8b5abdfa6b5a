#!/usr/bin/env bash
# On the GPU machine, in one call:
#   1. the second fresh set (calibrate_libraries.py --set fresh2), its
#      predictions committed before (data/calibration/fresh2-predictions.jsonl),
#      with every run's allocation history recorded;
#   2. the allocation histories of the rows still under-predicted beyond 5 %
#      (library rows and predictor-zoo rows), measured again;
#   3. beside them, on CPUs of their own: the CPU captures of the fresh set's
#      cases with the repository's vramfit.profile, and the convolution sweep
#      over the torchvision models' own shapes and layouts (channels-last as the
#      model hands it over).
#
#   scripts/gpu/fresh_sequences.sh OUT [SET]
#
# SET is the fresh set (fresh2 by default; its predictions are
# data/calibration/SET-predictions.jsonl). UNDER=0 leaves out step 2 and
# SWEEP=0 the convolution sweep; DEADLINE (seconds, 240 by default) is when
# the set stops starting runs. SWEEP_BATCHES (a comma-separated list of batch
# sizes) makes the sweep measure every model's shapes at those batches in
# each dtype (conv-batches.jsonl.gz), for at most SWEEP_DEADLINE seconds
# (400 by default). ONLY (comma-separated case names) runs those cases of the
# set alone, e.g. the ones an earlier call's deadline skipped.
#
# OUT gets: SET.jsonl, runs.log, libraries-under.jsonl,
# h200-under.jsonl, sequences.tgz (every recorded sequence as a profile),
# captures.tgz, conv-workspaces-layout.jsonl.gz (or conv-batches.jsonl.gz)
# and side.log.
set -uo pipefail
out=${1:?usage: fresh_sequences.sh OUT [SET]}
set_name=${2:-fresh2}
# shellcheck source=scripts/gpu/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
setup_run "$out"
gpu_cpus=0-$((ncpu - 7))
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
# The runs side by side may hold the GPU's memory less 30 GiB (110 GiB on an H200).
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
budget_gib=$((total_mib / 1024 - 30))

{
  PYTHONPATH=python taskset -c $((ncpu - 4))-$((ncpu - 1)) python3 scripts/capture_library_profiles.py \
    "data/calibration/$set_name-cases.jsonl" "$work/captures/$set_name"
  echo "capture rc=$?"
} >"$out/capture.log" 2>&1 &
if [[ ${SWEEP:-1} != 0 ]]; then
  {
    if [[ -n ${SWEEP_BATCHES:-} ]]; then
      taskset -c $((ncpu - 6)),$((ncpu - 5)) python3 scripts/gpu/conv_workspaces.py --grid 0 \
        --batches "$SWEEP_BATCHES" --deadline "${SWEEP_DEADLINE:-400}" --out "$work/conv-batches.jsonl"
    else
      taskset -c $((ncpu - 6)),$((ncpu - 5)) python3 scripts/gpu/conv_workspaces.py --grid 0 \
        --out "$work/conv-workspaces-layout.jsonl"
    fi
    echo "sweep rc=$?"
  } >"$out/sweep.log" 2>&1 &
fi

taskset -c "$gpu_cpus" python3 scripts/gpu/calibrate_libraries.py --set "$set_name" --snapshots \
  --out "$work/$set_name" --predictions "data/calibration/$set_name-predictions.jsonl" --budget-gib "$budget_gib" \
  --timeout 150 --deadline "${DEADLINE:-240}" ${ONLY:+--only "$ONLY"} 2>&1 | tee "$out/runs.log"

if [[ ${UNDER:-1} != 0 ]]; then
  under_libraries=hf-llamagqa-s2048-b4-bf16-sgd-eager,hf-llama-s1024-b4-ampbf16-adamw-sdpa-accum4,\
hf-mistral-s2048-b2-fp32-sgdm-sdpa,hf-qwen2-s2048-b2-bf16-adamw-sdpa-ckpt,\
hf-bert-s512-b32-ampbf16-adamw-sdpa
  taskset -c "$gpu_cpus" python3 scripts/gpu/calibrate_libraries.py --set calibration --snapshots \
    --no-repeats --only "$under_libraries" --out "$work/under" --timeout 120 --deadline 100 \
    2>&1 | tee -a "$out/runs.log"

  under_zoo=gpt2s-s1024-b8-ampbf16-adagrad,gpt2s-s1024-b8-ampbf16-adafactor,\
gpt2l-s1024-b4-ampbf16-adamw-ckpt,qwen2-s2048-b2-bf16-adamw-ckpt
  taskset -c "$gpu_cpus" python3 scripts/gpu/calibrate_predictor.py --snapshots --only "$under_zoo" \
    --out "$work/zoo" --deadline 120 2>&1 | tee -a "$out/runs.log"
fi

wait
cat "$out/capture.log" "$out"/sweep.log >"$out/side.log" 2>/dev/null
rm -f "$out/capture.log" "$out/sweep.log"
cp "$work/$set_name/$set_name.jsonl" "$out/"
mkdir -p "$work/sequences"
cp "$work/$set_name/$set_name-profiles.jsonl" "$work/sequences/"
if [[ ${UNDER:-1} != 0 ]]; then
  cp "$work/under/libraries.jsonl" "$out/libraries-under.jsonl"
  cp "$work/zoo/h200.jsonl" "$out/h200-under.jsonl"
  cp "$work/under/profiles.jsonl" "$work"/zoo/*.profile.json "$work/sequences/" 2>/dev/null
fi
tar -C "$work" -czf "$out/sequences.tgz" sequences
tar -C "$work" -czf "$out/captures.tgz" captures
for sweep in conv-workspaces-layout conv-batches; do
  if [[ -f "$work/$sweep.jsonl" ]]; then
    gzip -9c "$work/$sweep.jsonl" >"$out/$sweep.jsonl.gz"
  fi
done
ls -l "$out"
