#!/usr/bin/env python3
"""cuDNN's measured convolution workspaces as the table the predictor reads.

Reads the convolution sweeps (scripts/gpu/conv_workspaces.py) and writes one
line per measured convolution: its shape, batch and dtype, and the workspace
each of its three calls took from the caching allocator (bytes):

- the forward: the largest allocation freed inside the forward;
- the input's gradient: the largest freed after the input's gradient was
  allocated and before the weight's was;
- the weight's gradient: the largest freed after the weight's gradient was
  allocated and before the bias's (whose reduction buffers come after).

src/predict/conv.rs looks a call up here before it applies its rule, so the
shapes the sweeps measured (torchvision's models at their batch sizes) get
what cuDNN's heuristics took on the GPU.

    python3 scripts/conv_workspace_table.py --out src/predict/conv_workspaces.tsv.gz
    python3 scripts/conv_workspace_table.py --check src/predict/conv_workspaces.tsv.gz

The table is tab-separated text, gzip-compressed; --check compares the text.
"""

import argparse
import gzip
import json
import sys

# Later sweeps first: a shape measured twice keeps the later measurement.
SWEEPS = [
    "data/calibration/h100-conv-batches/conv-batches2.jsonl.gz",
    "data/calibration/h100-conv-batches/conv-batches.jsonl.gz",
    "data/calibration/h200-conv-workspaces/conv-workspaces-layout.jsonl.gz",
    "data/calibration/h200-conv-workspaces/conv-workspaces.jsonl.gz",
]
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
COLUMNS = ["dtype", "n", "c", "h", "w", "k", "r", "s", "stride", "padding", "dilation", "groups",
           "channelsLast", "forward", "input", "weight"]


def workspaces(row):
    sh, e = row["shape"], BYTES[row["dtype"]]
    n, c, h, w, k = row["n"], sh["c"], sh["h"], sh["w"], sh["k"]
    fwd = max(row["forward"]["transient"], default=0)
    input_bytes = n * c * h * w * e
    weight_bytes = k * (c // sh["groups"]) * sh["r"] * sh["s"] * e
    order = row["backward"].get("order")
    if order is None:
        return None
    phase, ws = 0, [0, 0]
    for size, freed in order:
        if not freed:
            if phase == 0 and size == input_bytes:
                phase = 1
            elif phase == 1 and size == weight_bytes:
                phase = 2
            elif phase == 2:
                phase = 3  # the bias's gradient: its reduction follows
        elif phase in (1, 2):
            ws[phase - 1] = max(ws[phase - 1], size)
    if phase < 2:
        return None
    return fwd, ws[0], ws[1]


def rows():
    seen = {}
    for path in SWEEPS:
        for line in gzip.open(path, "rt"):
            r = json.loads(line)
            if "error" in r or "forward" not in r:
                continue
            sh = r["shape"]
            key = (DTYPE[r["dtype"]], r["n"], sh["c"], sh["h"], sh["w"], sh["k"], sh["r"],
                   sh["s"], sh["stride"], sh["padding"], sh["dilation"], sh["groups"],
                   int(bool(sh.get("channelsLast", False))))
            if key in seen:
                continue
            ws = workspaces(r)
            if ws is not None:
                seen[key] = ws
    return [list(k) + list(v) for k, v in sorted(seen.items())]


def render():
    out = ["\t".join(COLUMNS)]
    out += ["\t".join(str(x) for x in r) for r in rows()]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the gzip-compressed table here")
    ap.add_argument("--check", help="fail unless this gzip-compressed table is what the sweeps give")
    args = ap.parse_args()
    text = render()
    if args.check:
        if gzip.open(args.check, "rt").read() != text:
            print(f"{args.check} is not what the sweeps give: rerun "
                  "scripts/conv_workspace_table.py --out", file=sys.stderr)
            return 1
        return 0
    if args.out:
        with open(args.out, "wb") as f:
            f.write(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
