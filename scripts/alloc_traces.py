"""Writes the GPU step traces of an alloc_checks run as replayable snapshots.

Usage: python3 scripts/alloc_traces.py RESULTS.json[.gz] OUT_DIR

scripts/gpu/alloc_checks.py --trace records, in round 1's native run of each
model, four more steps of PyTorch's allocation history and puts the
snapshot (the pickle of torch.cuda.memory._dump_snapshot, gzip, base64) in
results.json under "traces". This writes each as OUT_DIR/gpu_<model>.pickle.gz,
which alloc-core/src/replay_tests.rs replays (the trace starts mid-run: blocks
alive before it are allocated first, in address order).
"""

import base64
import gzip
import json
import os
import sys


def main():
    path, out = sys.argv[1], sys.argv[2]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        results = json.load(f)
    traces = results.get("traces") or {}
    if not traces:
        raise SystemExit(f"{path}: no traces")
    os.makedirs(out, exist_ok=True)
    for model, trace in sorted(traces.items()):
        target = os.path.join(out, f"gpu_{model}.pickle.gz")
        with open(target, "wb") as f:
            f.write(base64.b64decode(trace["snapshotGzB64"]))
        print(f"{target}: {os.path.getsize(target)} bytes, {trace['steps']} steps")


if __name__ == "__main__":
    main()
