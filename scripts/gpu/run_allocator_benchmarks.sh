#!/usr/bin/env bash
# Allocator results on a GPU machine, in one go: snapshots of five training
# runs, the probe, the allocator benchmark (cudarc caching vs raw) and the
# same mix through PyTorch's allocator.
#
# Usage: scripts/gpu/run_allocator_benchmarks.sh AGENT_BINARY OUT_DIR
set -uo pipefail
agent=$1
out=$2
mkdir -p "$out/snapshots"
export PYTHONUNBUFFERED=1
# NVRTC for the probe kernels: the toolkit's, or the one PyTorch ships.
nvrtc=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | head -1)
[ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
{
  echo "## nvidia-smi"
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,power.draw --format=csv
  echo "## nvrtc: $nvrtc"
  echo "## probe"
  "$agent" probe -o json
  echo "## bench alloc (cudarc)"
  "$agent" bench alloc -o json
  echo "## bench alloc (PyTorch)"
  python3 "$(dirname "$0")/bench_torch_alloc.py"
  echo "## PyTorch device-to-device copy (reference)"
  python3 - <<'PY'
import torch
a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
times = []
for i in range(22):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); e.synchronize()
    if i >= 2: times.append(s.elapsed_time(e))
times.sort(); ms = times[len(times) // 2]
print({"torchCopyGbps": 2 * a.numel() / (ms * 1e-3) / 1e9, "medianMs": ms})
PY
  echo "## capture snapshots"
  python3 "$(dirname "$0")/capture_snapshots.py" "$out/snapshots" --steps 3
  ls -la "$out/snapshots"
  cat "$out/snapshots/pytorch_reported.json"
} 2>&1
