"""Where a training step's time goes, and how much it varies between processes.

For each model and batch size, runs fresh processes under PyTorch's native
allocator and prints, per process, the median step time (wall, with a
synchronize at each end), the CPU time the Python thread spent in the step
(a launch-bound step spends nearly all of its wall time on the CPU), and the
GPU's busy time (CUDA events around the step's work). Used to choose sizes for
the step-time comparison in alloc_checks: a step whose time the GPU sets is
repeatable between processes; one the CPU sets is not, on a shared host.

    python3 scripts/gpu/step_noise.py [--procs 3] [--steps 24] [--pin]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = [
    ("gpt2", 8), ("gpt2", 32),
    ("llama", 4), ("llama", 16),
    ("vit", 64), ("vit", 256),
]


def worker(model, batch, steps, warmup):
    import torch

    # The models, optimizers and synthetic batches of alloc_checks.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from alloc_checks import build_model

    torch.manual_seed(0)
    _, opt, make, loss_of_batch = build_model(model, torch, batch)

    def loss_of(step):
        return loss_of_batch(make(step))

    wall, cpu, gpu = [], [], []
    for step in range(steps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, c0 = time.perf_counter(), time.thread_time()
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        c1 = time.thread_time()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((c1 - c0) * 1e3)
        gpu.append(start.elapsed_time(end))
    keep = slice(warmup, None)
    med = lambda xs: round(statistics.median(xs[keep]), 2)  # noqa: E731
    print(json.dumps({"model": model, "batch": batch, "wallMs": med(wall), "cpuMs": med(cpu),
                      "eventMs": med(gpu), "peakReservedMiB": torch.cuda.max_memory_reserved() >> 20,
                      "cpus": len(os.sched_getaffinity(0)), "wallAll": [round(w, 1) for w in wall]}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--pin", action="store_true", help="also run each process pinned to 4 cores")
    p.add_argument("--worker", nargs=2)
    args = p.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.steps, args.warmup)
        return
    modes = [False, True] if args.pin else [False]
    for model, batch in CONFIGS:
        for pinned in modes:
            rows = []
            for _ in range(args.procs):
                cmd = [sys.executable, __file__, "--steps", str(args.steps), "--warmup", str(args.warmup),
                       "--worker", model, str(batch)]
                if pinned:
                    cmd = ["taskset", "-c", "2-5"] + cmd
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                line = out.stdout.strip().splitlines()[-1:] or [out.stderr[-400:]]
                try:
                    rows.append(json.loads(line[0]))
                except ValueError:
                    print("ERROR", model, batch, line[0], flush=True)
            if rows:
                walls = [r["wallMs"] for r in rows]
                spread = (max(walls) - min(walls)) / statistics.median(walls) * 100
                print(json.dumps({"model": model, "batch": batch, "pinned": pinned, "spreadPct": round(spread, 1),
                                  "runs": rows}), flush=True)


if __name__ == "__main__":
    main()
