#!/usr/bin/env bash
# OOM recovery on a real GPU (issues 10 and 17), GPT-2 small, global batch 64,
# fp32, dropout off, 5 optimizer steps, synthetic data that depend only on the step:
#   reference  outside vramfit, micro 4 x accumulation 16, no budget;
#   (a) restart: `vramfit run --local` with an 18 GiB budget, starting at micro
#       16: a real CUDA OOM, exit 42, the next attempt at 8 x 8 runs the steps;
#   (b) in-process: the same job with --absorb: vramfit.Step halves the
#       micro-batch inside the process and re-runs the step.
# scripts/gpu/recovery_check.py compares losses and parameters with the
# reference and the recovery times, prints a summary and fails on a miss.
# Writes $OUT/helper/recovery.json and $OUT/helper/recovery.log.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out_dir=${OUT:-/tmp/vramfit-out}/helper
mkdir -p "$out_dir"
work=$(mktemp -d /tmp/vramfit-recovery.XXXXXX)
bin=${VRAMFIT_BIN:-.dev-bin/vramfit}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# PyTorch's allocator with set_per_process_memory_fraction: the budget that the
# controller applies today, whatever else is installed.
export VRAMFIT_ALLOCATOR=native
job=scripts/gpu/recovery-gpt2.yaml
# Dropout off: its masks depend on how a batch is split into micro-batches, so
# with it the runs would differ by more than the order of their sums.
train=(python3 -m vramfit.examples.gpt2 --steps 5 --seed 0 --lr 3e-4 --eval-samples 8 --dropout 0)
start=$(date +%s)

echo "== reference (micro 4 x 16, no budget)"
"${train[@]}" --micro 4 --global-batch 64 --events "$work/ref.jsonl" \
  --save-init "$work/init.pt" --save-params "$work/ref.pt" 2>"$work/ref.log"
echo "rc=$?"

echo "== (a) restart path: vramfit run --local, starting at micro 16"
"$bin" run --local "$job" --workdir "$work/restart" -o json -- \
  "${train[@]}" --events "$work/restart.jsonl" --save-params "$work/restart.pt" \
  >"$work/restart.json" 2>"$work/restart.log"
echo "rc=$?"

echo "== (b) in-process: the same job, OOMs absorbed by vramfit.Step"
"$bin" run --local "$job" --workdir "$work/inproc" -o json -- \
  "${train[@]}" --absorb --events "$work/inproc.jsonl" --save-params "$work/inproc.pt" \
  >"$work/inproc.json" 2>"$work/inproc.log"
echo "rc=$?"

python3 scripts/gpu/recovery_check.py "$work" "$out_dir"
rc=$?
echo "recovery.sh finished in $(( $(date +%s) - start )) s (rc=$rc)"
exit $rc
