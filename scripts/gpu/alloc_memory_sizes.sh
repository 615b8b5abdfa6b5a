#!/usr/bin/env bash
# Reserved peak of the vramfit policy against PyTorch's native allocator at
# two sizes per model: the sizes of alloc_checks runs 6-7 (launch-sized
# steps, where native's caching leaves the most unused) and the sizes that
# fill the chip (alloc_checks run 8 on). One fresh process per row, 10 steps;
# the floor is native's allocated peak (what any allocator must hold).
#
#   bash scripts/gpu/alloc_memory_sizes.sh   # on the GPU machine; writes $OUT/alloc-sizes/
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${OUT:-/tmp/out}/alloc-sizes"
mkdir -p "$out/stats"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export VRAMFIT_ALLOCATOR_LIB="$PWD/.dev-bin/libvramfit_alloc.so"
export VRAMFIT_STATS_DIR="$out/stats"
export CUBLAS_WORKSPACE_CONFIG=":4096:8" PYTHONUNBUFFERED=1
unset VRAMFIT_BUDGET_BYTES
rows="$out/rows.jsonl"
: > "$rows"
for spec in gpt2:8 llama:4 bert:32 vit:64 resnet50:128 gpt2:32 llama:16 bert:128 vit:256; do
  model=${spec%%:*} batch=${spec##*:}
  for alloc in native vramfit; do
    line=$(timeout 120 python3 scripts/gpu/alloc_checks.py worker-train --model "$model" --batch "$batch" \
      --alloc "$alloc" --steps 10 --warmup 3 2>>"$out/stderr.log" | grep '^RESULT ' | tail -1)
    echo "${line#RESULT }" >> "$rows"
  done
done
python3 - "$rows" <<'PY' | tee "$out/table.txt"
import json, sys
MIB = 1 << 20
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
by = {(r["model"], r["batch"], r["alloc"]): r for r in rows}
print(f"{'model':<9} {'batch':>5} {'native res':>11} {'native alloc':>12} {'floor':>7} {'vramfit res':>11} {'vs native':>9} {'above floor':>11}")
for (model, batch, alloc), n in by.items():
    if alloc != "native":
        continue
    v = by.get((model, batch, "vramfit"))
    if "maxReserved" not in n or not v or "maxReserved" not in v:
        print(f"{model:<9} {batch:>5} missing: {json.dumps(n)[:200]} {json.dumps(v)[:200]}")
        continue
    nr, na, vr = n["maxReserved"], n["maxAllocated"], v["maxReserved"]
    print(f"{model:<9} {batch:>5} {nr / MIB:>11.0f} {na / MIB:>12.0f} {(na / nr - 1) * 100:>+6.1f}% {vr / MIB:>11.0f}"
          f" {(vr / nr - 1) * 100:>+8.1f}% {(vr - na) / MIB:>+10.0f}M")
PY
