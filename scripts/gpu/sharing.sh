#!/usr/bin/env bash
# What sharing a GPU costs in step time: K copies of one training kind
# (scripts/gpu/step_time.py, one process each) on the same GPU, their timed
# steps started together (--barrier), for K = 1, 2 and 4, at one
# micro-batch per kind (its preferred shape in the demo).
#
#   scripts/gpu/sharing.sh OUT
#
# OUT/sharing.jsonl: one line per process (copies = K).
set -uo pipefail
out=${1:?usage: sharing.sh OUT}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for spec in gpt2:16 resnet50:64 bert:16; do
  kind=${spec%%:*} micro=${spec##*:}
  for k in 1 2 4; do
    barrier=$(mktemp -d)
    for _ in $(seq "$k"); do
      python3 "$here/step_time.py" --only "$kind" --micros "$micro" --steps 5 --copies "$k" \
        --barrier "$barrier" --out "$out/sharing.jsonl" &
    done
    wait
    rm -rf "$barrier"
  done
done
python3 - "$out/sharing.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
alone = {r["model"]: r["medianStepSeconds"] for r in rows if r["copies"] == 1 and "medianStepSeconds" in r}
for r in rows:
    if "medianStepSeconds" in r:
        print(f'{r["model"]:10} micro {r["micro"]:3} copies {r["copies"]}: {r["medianStepSeconds"]:.4f} s '
              f'({r["medianStepSeconds"] / alone[r["model"]]:.2f}x alone)')
    else:
        print(r["model"], r["copies"], r.get("error"))
PY
