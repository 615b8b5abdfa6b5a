#!/usr/bin/env python3
"""Capture, on the CPU, the allocation profile of each configuration of the
predictor's calibration zoo (scripts/gpu/calibrate_predictor.py: its own
GPT-2, LLaMA, Qwen2 and BERT modules and MLPs, not a library's) with
`vramfit.profile.capture_step`: the zoo's model and training step run as the
GPU run trains them (checkpointing with `torch.utils.checkpoint` itself),
so that `vramfit bench predict --profiles DIR --prefer-profiles` checks the
profile path of arbitrary training code against the H200's measurements.

Usage:
    PYTHONPATH=python python3 scripts/capture_reference_profiles.py \
        data/calibration/h200.jsonl OUT [--only NAME,NAME]

A measured row whose configuration is not in the zoo, or whose optimizer
this machine lacks (8-bit AdamW without bitsandbytes), is reported and left
out.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))

import calibrate_predictor as zoo  # noqa: E402


def convert(module, dtype):
    """`module.to(dtype)` as nn.Module runs it (children first, each one's
    parameters then its buffers, a parameter's data replaced in place), for
    the capture's parameters, which `Module.to` would try to swap."""
    for child in module.children():
        convert(child, dtype)
    for p in module._parameters.values():
        if p is not None and p.is_floating_point():
            p.data = p.data.to(dtype)
    for name, b in module._buffers.items():
        if b is not None and b.is_floating_point():
            module._buffers[name] = b.to(dtype)


def capture(profile, c):
    """The profile of zoo configuration `c`, captured on the CPU."""
    import torch

    pure, _ = zoo.precisions(c)
    with torch.device("meta"):
        model = zoo.build_model(c["arch"], c["attention"])
    # GradScaler's step reads whether a gradient overflowed, which fake
    # tensors cannot answer; the capture's scaler runs its kernels instead.
    scaler = profile._Scaler() if c["precision"] == "amp-fp16" else None
    made = []

    def step(m):
        if not made:
            # The GPU run builds the model in fp32 on the GPU, converts it
            # to its low precision and then makes the optimizer: so does the
            # capture, in its first step.
            if pure is not None:
                convert(m, pure)
            made.append(zoo.make_optimizer(c["optimizer"], m.parameters()))
        zoo.train_step(c, m, made[0], scaler)

    return profile.capture_step(model, step, micro_batch=c["micro"], steps=c["steps"],
                                grad_accum=c["accum"], source=c["name"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("measured", help="the zoo's measured rows (JSON lines with `name`)")
    ap.add_argument("outdir")
    ap.add_argument("--only", default="", help="comma-separated names")
    args = ap.parse_args()
    from vramfit import profile

    by_name = {c["name"]: c for c in zoo.ZOO}
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.outdir, exist_ok=True)
    failed = 0
    for line in open(args.measured):
        name = json.loads(line)["name"]
        if only and name not in only:
            continue
        c = by_name.get(name)
        if c is None:
            print(f"{name}: not in the zoo", flush=True)
            failed += 1
            continue
        t0 = time.time()
        try:
            p = capture(profile, c)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            failed += 1
            continue
        p["name"] = name
        with open(os.path.join(args.outdir, name + ".profile.json"), "w") as f:
            json.dump(p, f, separators=(",", ":"))
        print(f"{name}: {len(p['events'])} events, live peak "
              f"{p['capture']['peakLiveBytes'] / 2**30:.3f} GiB, {time.time() - t0:.1f}s",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
