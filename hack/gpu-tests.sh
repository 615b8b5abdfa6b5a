#!/usr/bin/env bash
# GPU tests: CI has no GPU, so the tests marked `#[ignore = "needs GPU"]` run on
# a GPU machine that has no Rust toolchain. Build here, run there.
#
#   hack/gpu-tests.sh build   build the agent (cuda feature) and its test binary into .devbin/
#   hack/gpu-tests.sh run     on the GPU machine: run the ignored GPU tests and the probe
#   hack/gpu-tests.sh ptx     on the GPU machine: compile agent/src/cuda/probe_kernels.cu
#                             to the PTX the agent loads (compute_75: any GPU from Turing (T4) on, the oldest CUDA 13 compiles for;
#                             the driver compiles it for the GPU it runs on), with the
#                             source's hash on its first line (checked by the agent's tests)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/vramfit/target}

case ${1:-} in
  build)
    mkdir -p .devbin
    cargo build --release -p vramfit-agent --features cuda
    cp "$CARGO_TARGET_DIR/release/vramfit-agent" .devbin/
    test_bin=$(cargo test --release -p vramfit-agent --features cuda --no-run --message-format=json 2>/dev/null |
      python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | tail -1)
    cp "$test_bin" .devbin/agent-tests
    ls -la .devbin
    ;;
  run)
    # The probe kernels are PTX built ahead of time: no NVRTC needed.
    .devbin/agent-tests --ignored --test-threads 1
    .devbin/vramfit-agent probe -o json
    ;;
  ptx)
    src=agent/src/cuda/probe_kernels.cu
    out=agent/src/cuda/probe_kernels.ptx
    hash=$(python3 -c 'import sys
h = 0xcbf29ce484222325
for b in open(sys.argv[1], "rb").read():
    h = ((h ^ b) * 0x100000001b3) % (1 << 64)
print(f"{h:016x}")' "$src")
    nvcc --version | tail -2
    { echo "// source fnv1a64 $hash ($src, nvcc -ptx -arch=compute_75)"
      nvcc -ptx -arch=compute_75 -o - "$src"; } >"$out.tmp"
    mv "$out.tmp" "$out"
    head -20 "$out"
    ;;
  *) sed -n '2,11p' "$0"; exit 2 ;;
esac
