#!/usr/bin/env bash
# GPU tests: CI has no GPU, so the tests marked `#[ignore = "needs GPU"]` run on
# a GPU machine that has no Rust toolchain. Build here, run there.
#
#   hack/gpu-tests.sh build   build the agent (cuda feature) and its test binary into .devbin/
#   hack/gpu-tests.sh run     on the GPU machine: run the ignored GPU tests and the probe
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
    # NVRTC for the probe kernels: the toolkit's, or the one PyTorch ships.
    nvrtc=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | head -1)
    [[ -n $nvrtc ]] && export LD_LIBRARY_PATH="$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
    .devbin/agent-tests --ignored --test-threads 1
    .devbin/vramfit-agent probe -o json
    ;;
  *) sed -n '2,7p' "$0"; exit 2 ;;
esac
