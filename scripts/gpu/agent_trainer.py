#!/usr/bin/env python3
"""A real PyTorch training process for scripts/gpu/agent_checks.sh.

Trains a small transformer language model with AdamW on random tokens, in
phases of growing micro-batch (so its memory rises in steps), and samples its
own NVML per-process figure every 20 ms in a thread: the "run's own NVML
peak" the agent's report is compared with. With --grow-gib it also keeps one
more GiB alive every second, so it exceeds any budget (the watchdog test).
With --micro-from-env it trains one phase at vramfit's VRAMFIT_MICRO_BATCH,
and --hoard-gib-per-sample keeps that many GiB per sample alive from the
start, so its memory halves with the micro-batch but nothing in the process
holds it to its budget (the `vramfit run --local` check: only the agent can).

Writes a JSON result (pid, steps, own NVML peak, ...) at the end, and a
progress file after every step.
"""
import argparse
import ctypes
import json
import os
import threading
import time

import torch


class NvmlProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class OwnNvml:
    """This process's used bytes on NVML device `index`, through libnvidia-ml."""

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.handle = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle)) == 0
        self.pid = os.getpid()

    def used(self):
        count = ctypes.c_uint(256)
        infos = (NvmlProcessInfo * 256)()
        rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.handle, ctypes.byref(count), infos)
        if rc != 0:
            return 0
        for i in range(count.value):
            if infos[i].pid == self.pid:
                return infos[i].usedGpuMemory
        return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--result", required=True)
    p.add_argument("--phases", default="8,16,32", help="micro-batches, one phase each")
    p.add_argument("--phase-seconds", type=float, default=8.0)
    p.add_argument("--hold-seconds", type=float, default=4.0, help="idle at the end, memory kept")
    p.add_argument("--grow-gib", type=float, default=0.0, help="extra GiB kept alive per second")
    p.add_argument("--micro-from-env", action="store_true", help="one phase at $VRAMFIT_MICRO_BATCH")
    p.add_argument("--hoard-gib-per-sample", type=float, default=0.0, help="GiB per sample kept alive from the start")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    if args.micro_from_env:
        args.phases = os.environ["VRAMFIT_MICRO_BATCH"]

    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    vocab, seq = 32000, 512
    layer = torch.nn.TransformerEncoderLayer(args.hidden, 16, 4 * args.hidden, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, args.hidden),
        torch.nn.TransformerEncoder(layer, args.layers),
        torch.nn.Linear(args.hidden, vocab),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    nvml = OwnNvml(0)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], nvml.used())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    steps = 0
    hoard = []
    if args.hoard_gib_per_sample > 0:
        micro0 = int(args.phases.split(",")[0])
        gib = int(args.hoard_gib_per_sample * micro0)
        hoard.extend(torch.ones((1 << 30) // 4, dtype=torch.float32, device=dev) for _ in range(gib))
    started = time.time()
    last_grow = started
    progress = args.result + ".progress"
    for micro in [int(m) for m in args.phases.split(",")]:
        phase_end = time.time() + args.phase_seconds
        while time.time() < phase_end:
            x = torch.randint(0, vocab, (micro, seq), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), x.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            steps += 1
            if args.grow_gib > 0 and time.time() - last_grow >= 1.0:
                hoard.append(torch.ones(int(args.grow_gib * (1 << 30)) // 4, dtype=torch.float32, device=dev))
                last_grow = time.time()
            with open(progress, "w") as f:
                json.dump({"pid": os.getpid(), "steps": steps, "t": time.time()}, f)
    time.sleep(args.hold_seconds)
    stop.set()
    sampler.join()
    peak[0] = max(peak[0], nvml.used())
    result = {
        "pid": os.getpid(),
        "steps": steps,
        "seconds": time.time() - started,
        "ownNvmlPeakBytes": peak[0],
        "ownNvmlEndBytes": nvml.used(),
        "torchMaxReservedBytes": torch.cuda.max_memory_reserved(),
        "completed": True,
    }
    with open(args.result, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
