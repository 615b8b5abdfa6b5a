#!/usr/bin/env python3
"""Record vramfit's predictions for a calibration set before it is measured.

For every row of a set's `--dry-run` listing (scripts/gpu/calibrate_libraries.py
--set NAME --dry-run) this asks `vramfit predict` for the analytic prediction
of the job's spec and, where a CPU capture exists in PROFILES
(scripts/capture_library_profiles.py), for the prediction from that profile.
One JSON line per case, with the commit of the code that predicted:

    python3 scripts/record_predictions.py --vramfit target/release/vramfit \\
        DRY_RUN.jsonl data/profiles/heldout > data/calibration/heldout-predictions.jsonl
"""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile


def manifest(spec, profile=False):
    spec = json.loads(json.dumps(spec))
    if profile:
        model = spec["model"]
        for k in ("huggingFace", "torchvision", "transformer", "mlp"):
            model.pop(k, None)
        model["profile"] = {"configMapRef": {"name": "captured", "key": "profile.json"}}
    spec["template"] = {"spec": {"containers": [{"name": "train", "image": "train"}]}}
    return {"apiVersion": "vramfit.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": "heldout", "namespace": "ml"}, "spec": spec}


def predict(vramfit, spec, profile_path=None):
    cmd = [vramfit, "predict", "-f", "-", "--gpu", "H200"]
    if profile_path:
        cmd += ["--profile", profile_path]
    p = subprocess.run(cmd, input=json.dumps(manifest(spec, profile_path is not None)),
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[0] if p.stderr.strip() else f"exit {p.returncode}"}
    o = json.loads(p.stdout)
    return {k: o[k] for k in ("peakBytes", "reservedBytes", "allocatedBytes") if k in o}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dry_run")
    ap.add_argument("profiles")
    ap.add_argument("--vramfit", default="target/release/vramfit")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for line in open(args.dry_run):
        row = json.loads(line)
        out = {"name": row["name"], "split": row["split"], "commit": commit}
        if row["library"] == "transformers":
            out["analytic"] = predict(args.vramfit, row["spec"])
        prof = os.path.join(args.profiles, row["name"] + ".profile.json")
        if os.path.exists(prof):
            out["profile"] = predict(args.vramfit, row["spec"], prof)
        elif os.path.exists(prof + ".gz"):
            # the repository keeps its captures gzipped
            with tempfile.NamedTemporaryFile("wb", suffix=".profile.json") as plain:
                with gzip.open(prof + ".gz", "rb") as packed:
                    shutil.copyfileobj(packed, plain)
                plain.flush()
                out["profile"] = predict(args.vramfit, row["spec"], plain.name)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
