#!/usr/bin/env bash
# libvramfit_alloc.so on the GPU machine, in one go (about 5 minutes, at
# most 8: no new case after 420 s, training rounds only while they fit in
# 400 s): correctness under PyTorch (statistics, empty_cache, streams, budget
# OOM, graphs, fork), `vramfit-agent bench alloc`, five models' training runs
# at sizes that fill the chip (GPT-2 32x1024, LLaMA-style 16x2048, BERT
# 128x512, ResNet-50 128, ViT-B/16 256) under PyTorch's allocator and ours
# (both policies) in up to five interleaved rounds, and on GPT-2 8x1024 a
# budget below the need and two budgeted processes sharing the GPU.
# Every case runs in its own subprocess with a timeout. Writes
# $OUT/alloc/{results.json,log.txt}.
#
# Usage (repo root): scripts/gpu/alloc_checks.sh [--quick]
# Needs .dev-bin/libvramfit_alloc.so and .dev-bin/vramfit-agent (release builds).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${OUT:-/tmp/out}/alloc"
mkdir -p "$out"
lib=.dev-bin/libvramfit_alloc.so
agent=.dev-bin/vramfit-agent
if [[ ! -f $lib ]]; then
  echo "FAIL: $lib is missing (build with: cargo build --release -p vramfit-alloc)" | tee "$out/log.txt"
  exit 1
fi
{
  echo "## nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  python3 -c 'import torch, transformers, torchvision; print("torch", torch.__version__, "transformers", transformers.__version__, "torchvision", torchvision.__version__)'
  echo "## exported symbols"
  nm -D --defined-only "$lib" | grep ' T vramfit_' | awk '{print $3}' | tr '\n' ' '
  echo
} 2>&1
timeout 480 python3 scripts/gpu/alloc_checks.py "$out" --lib "$lib" --agent "$agent" "$@"
rc=$?
[[ $rc == 124 ]] && echo "FAIL: alloc_checks.py ran past 480 s"
exit $rc
