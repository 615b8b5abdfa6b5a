#!/usr/bin/env python3
"""Measure ZeRO-sharded training peaks on 2, 4 or 8 GPUs to check `vramfit predict`.

Pure PyTorch (torch.distributed over NCCL, one process per GPU); the models are
the ones of calibrate_predictor.py. For each configuration the parent starts one
fresh worker process per rank and samples NVML's per-process used memory of
every worker on every GPU every ~3 ms; each worker reports its stages (CUDA
context, NCCL communicator up, model built, end of training) and waits for the
parent's NVML reading after each.

ZeRO stages, as a PyTorch user gets them without DeepSpeed:

  0  DistributedDataParallel (default 25 MiB gradient buckets, grads copied
     into the buckets: gradient_as_bucket_view=False).
  1  DDP + torch.distributed.optim.ZeroRedundancyOptimizer (optimizer state
     partitioned by whole parameters over the ranks, updated parameters
     broadcast after the step).
  2  FSDP2 `fully_shard(block, reshard_after_forward=False)` per block and on
     the root: the ZeRO-2-like mode. Gradients and optimizer state are
     sharded; parameters are gathered at a block's first forward and stay
     unsharded until its backward is done.
  3  FSDP2 `fully_shard` default (reshard after forward): ZeRO-3.

FSDP models are built on the meta device and materialised shard by shard
(`to_empty`), as large models are in practice, so the full model never sits on
one GPU. DDP models are built on the GPU like calibrate_predictor.py does.
Mixed precision `amp-*` is fp32 weights under torch.autocast (no FSDP
MixedPrecisionPolicy), as on one GPU.

Two sets of configurations, each with its held-out split fixed below before any
measurement: `CONFIGS` (GPT-2 124M-355M and a 1B LLaMA, run on two GPUs) and
`MULTI_CONFIGS` (GPT-2 XL 1.5B, LLaMA-style 3B and 7B, run on 4 and 8 GPUs,
where per-GPU shards shrink and communication buffers do not).

Usage:
    python3 scripts/gpu/calibrate_zero.py --out DIR [--world N] [--deadline SECONDS]
    python3 scripts/gpu/calibrate_zero.py --dry-run [--world N]   # list, no GPU

`--world` defaults to 2 (the `CONFIGS` set); 4 and 8 run `MULTI_CONFIGS`.
Output: DIR/h200xN-zero.jsonl, one line per configuration, the format of
data/calibration/h200.jsonl with `spec.gpus` N and `spec.model.zeroStage`;
`measured.nvmlPeakBytes` is the largest per-process peak over the ranks on the
rank's own GPU, and `measured.ranks` holds each rank's figures.
"""

import argparse
import json
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import calibrate_predictor as cp  # noqa: E402  (torch is imported lazily there)

# The number of ranks; set by --world in the parent and from WORLD_SIZE in
# each worker.
WORLD = int(os.environ.get("WORLD_SIZE", "2"))
H = "holdout"


def Z(name, arch, micro, precision, optimizer, zero, ckpt=False, split="fit", hf=False,
      steps=3):
    c = cp.C(name, arch, micro, precision, optimizer, ckpt=ckpt, split=split, hf=hf,
             steps=steps)
    c["zero"] = zero
    return c


GPT2S = cp.gpt2(**cp.GPT2_S, seq=1024)
GPT2M = cp.gpt2(**cp.GPT2_M, seq=1024)
L1B = cp.llama(**cp.LLAMA_1B, seq=2048)
# The split is fixed here, before any measurement: about half held out. Ordered
# so that a deadline cuts the least useful ones.
CONFIGS = [
    Z("z0-gpt2s-s1024-b8-ampbf16-adamw", GPT2S, 8, "amp-bf16", "adamw", 0),
    Z("z0-llama1b-s2048-b4-bf16-adamw", L1B, 4, "bf16", "adamw", 0, hf=True),
    Z("z3-gpt2s-s1024-b8-ampbf16-adamw", GPT2S, 8, "amp-bf16", "adamw", 3, split=H),
    Z("z3-llama1b-s2048-b4-bf16-adamw", L1B, 4, "bf16", "adamw", 3, hf=True),
    Z("z2-gpt2s-s1024-b8-ampbf16-adamw", GPT2S, 8, "amp-bf16", "adamw", 2),
    Z("z2-llama1b-s2048-b4-bf16-adamw", L1B, 4, "bf16", "adamw", 2, hf=True, split=H),
    Z("z1-gpt2s-s1024-b8-ampbf16-adamw", GPT2S, 8, "amp-bf16", "adamw", 1, split=H),
    Z("z1-llama1b-s2048-b4-bf16-adamw", L1B, 4, "bf16", "adamw", 1, hf=True, split=H),
    Z("z1-gpt2m-s1024-b8-ampbf16-adamw", GPT2M, 8, "amp-bf16", "adamw", 1, hf=True),
    Z("z3-gpt2m-s1024-b8-ampbf16-adamw", GPT2M, 8, "amp-bf16", "adamw", 3, hf=True),
    Z("z2-gpt2m-s1024-b8-ampbf16-adamw-ckpt", GPT2M, 8, "amp-bf16", "adamw", 2, ckpt=True, hf=True, split=H),
    Z("z3-llama1b-s2048-b8-bf16-adamw-ckpt", L1B, 8, "bf16", "adamw", 3, ckpt=True, hf=True, split=H),
    Z("z0-llama1b-s2048-b8-bf16-adamw-ckpt", L1B, 8, "bf16", "adamw", 0, ckpt=True, hf=True),
]

GPT2XL = cp.gpt2(**cp.GPT2_XL, seq=1024)
L3B = cp.llama(**cp.LLAMA_3B, seq=2048)
L7B = cp.llama(**cp.LLAMA_7B, seq=2048)
L7B_4K = cp.llama(**cp.LLAMA_7B, seq=4096)
# 4 and 8 GPUs: the same list on both, split fixed here before any measurement
# (6 of 13 held out, every stage on both sides). Pure bf16 keeps a 7B DDP
# replica (weights, gradients, DDP's buckets, AdamW state: 10 B/parameter)
# inside one H200; the sharded stages also run fp32 weights under autocast.
MULTI_CONFIGS = [
    Z("z3-llama7b-s2048-b2-bf16-adamw-ckpt", L7B, 2, "bf16", "adamw", 3, ckpt=True, hf=True),
    Z("z0-gpt2xl-s1024-b4-ampbf16-adamw", GPT2XL, 4, "amp-bf16", "adamw", 0, hf=True),
    Z("z3-llama7b-s2048-b2-ampbf16-adamw-ckpt", L7B, 2, "amp-bf16", "adamw", 3, ckpt=True, hf=True, split=H),
    Z("z2-llama3b-s2048-b4-bf16-adamw", L3B, 4, "bf16", "adamw", 2, hf=True),
    Z("z2-llama3b-s2048-b4-bf16-adamw-ckpt", L3B, 4, "bf16", "adamw", 2, ckpt=True, hf=True, split=H),
    Z("z3-llama3b-s2048-b4-bf16-adamw", L3B, 4, "bf16", "adamw", 3, hf=True, split=H),
    Z("z1-llama3b-s2048-b2-bf16-adamw", L3B, 2, "bf16", "adamw", 1, hf=True),
    Z("z1-gpt2xl-s1024-b4-ampbf16-adamw", GPT2XL, 4, "amp-bf16", "adamw", 1, hf=True, split=H),
    Z("z0-llama3b-s2048-b2-bf16-adamw-ckpt", L3B, 2, "bf16", "adamw", 0, ckpt=True, hf=True, split=H),
    Z("z3-gpt2xl-s1024-b8-ampbf16-adamw", GPT2XL, 8, "amp-bf16", "adamw", 3, hf=True),
    Z("z2-gpt2xl-s1024-b8-ampbf16-adamw-ckpt", GPT2XL, 8, "amp-bf16", "adamw", 2, ckpt=True, hf=True),
    Z("z3-llama7b-s4096-b1-bf16-adamw-ckpt", L7B_4K, 1, "bf16", "adamw", 3, ckpt=True, hf=True, split=H),
    Z("z0-llama7b-s2048-b1-bf16-adamw-ckpt", L7B, 1, "bf16", "adamw", 0, ckpt=True, hf=True),
]


def configs_for(world):
    """The configuration set measured at `world` ranks."""
    if world == 2:
        return CONFIGS
    if world in (4, 8):
        return MULTI_CONFIGS
    raise ValueError(f"--world {world}: 2, 4 or 8")


def job_spec(c):
    s = cp.job_spec(c)
    s["gpus"] = WORLD
    s["batch"]["global"] = c["micro"] * c["accum"] * WORLD
    s["model"]["zeroStage"] = c["zero"]
    return s


# ------------------------------------------------------------------- the worker


def worker(c, rank, wfd, rfd):
    import contextlib
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    def stage(name, **kw):
        kw.update(reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
        os.write(wfd, (json.dumps(dict(stage=name, rank=rank, **kw)) + "\n").encode())
        os.read(rfd, 1)

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    stage("context")
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    t = torch.ones(1024, device=dev)
    dist.all_reduce(t)
    dist.barrier()
    torch.cuda.synchronize()
    del t
    stage("nccl")

    a, prec, zero = c["arch"], c["precision"], c["zero"]
    pure = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec)
    amp = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(prec)
    if zero <= 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        with dev:
            model = cp.build_model(a, c["attention"])
        if pure is not None:
            model = model.to(pure)
        nparams = sum(p.numel() for p in model.parameters())
        model = DDP(model, device_ids=[rank])
        inner = model.module
        if zero == 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                          lr=1e-4)
            if c["optimizer"] != "adamw":
                raise ValueError("zero 1 runs adamw only")
        else:
            opt = cp.make_optimizer(c["optimizer"], model.parameters())
    else:
        from torch.distributed.fsdp import fully_shard
        with torch.device("meta"):
            model = cp.build_model(a, c["attention"])
        if pure is not None:
            model = model.to(pure)
        nparams = sum(p.numel() for p in model.parameters())
        raf = zero == 3
        for b in model.blocks:
            fully_shard(b, reshard_after_forward=raf)
        fully_shard(model, reshard_after_forward=raf)
        model.to_empty(device=dev)
        with torch.no_grad():
            for p in model.parameters():
                getattr(p, "_local_tensor", p).normal_(0.0, 0.02)
            for b in model.buffers():
                if b.dtype == torch.bool:
                    b.copy_(torch.ones_like(b).triu(1))
                else:
                    b.uniform_(-1.0, 1.0)
        inner = model
        opt = cp.make_optimizer(c["optimizer"], model.parameters())
    del inner
    torch.cuda.synchronize()
    stage("built", params=nparams)

    B = c["micro"]
    gen = torch.Generator(device=dev).manual_seed(rank)
    attn_ctx = contextlib.nullcontext
    t0 = time.time()
    for _ in range(c["steps"]):
        idx = torch.randint(0, a["vocab"], (B, a["seq"]), device=dev, generator=gen)
        tgt = torch.randint(0, a["vocab"], (B, a["seq"]), device=dev, generator=gen)
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None), attn_ctx():
            loss = model(idx, tgt, c["ckpt"])
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    secs = time.time() - t0
    dist.barrier()
    torch.cuda.synchronize()
    stage("end", maxReserved=torch.cuda.max_memory_reserved(),
          maxAllocated=torch.cuda.max_memory_allocated(), seconds=secs,
          numAllocRetries=torch.cuda.memory_stats().get("num_alloc_retries", 0))
    dist.barrier()
    dist.destroy_process_group()
    _ = F


# ------------------------------------------------------------------- the parent


class Nvml:
    def __init__(self):
        import pynvml
        pynvml.nvmlInit()
        self.nv = pynvml
        self.h = [pynvml.nvmlDeviceGetHandleByIndex(i)
                  for i in range(pynvml.nvmlDeviceGetCount())]
        self.name = pynvml.nvmlDeviceGetName(self.h[0])

    def usage(self):
        """{(device, pid): bytes} for every compute process."""
        out = {}
        for d, h in enumerate(self.h):
            try:
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:  # noqa: BLE001
                procs = []
            for p in procs:
                out[(d, p.pid)] = p.usedGpuMemory or 0
        return out


def run_config(c, nvml, port, timeout):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(WORLD), NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
    procs, rpipes, wpipes = [], [], []
    for rank in range(WORLD):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", c["name"], str(rank),
             str(w1), str(r2)],
            env=env_r, pass_fds=(w1, r2), stdout=sys.stdout, stderr=sys.stderr)
        os.close(w1)
        os.close(r2)
        procs.append(p)
        rpipes.append(r1)
        wpipes.append(w2)
    pids = [p.pid for p in procs]
    stages = [dict() for _ in range(WORLD)]
    peak_own = [0] * WORLD
    peak_other = [0] * WORLD
    bufs = [b""] * WORLD
    open_fds = set(rpipes)
    t0 = time.time()
    error = None

    def sample():
        u = nvml.usage()
        for r, pid in enumerate(pids):
            peak_own[r] = max(peak_own[r], u.get((r, pid), 0))
            other = sum(v for (d, q), v in u.items() if q == pid and d != r)
            peak_other[r] = max(peak_other[r], other)
        return u

    while open_fds:
        ready, _, _ = select.select(list(open_fds), [], [], 0.003)
        sample()
        for fd in ready:
            r = rpipes.index(fd)
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            bufs[r] += chunk
            while b"\n" in bufs[r]:
                line, bufs[r] = bufs[r].split(b"\n", 1)
                msg = json.loads(line)
                time.sleep(0.05)
                readings = [sample() for _ in range(3)]
                msg["nvmlProc"] = max(u.get((r, pids[r]), 0) for u in readings)
                msg["nvmlOtherGpus"] = max(
                    sum(v for (d, q), v in u.items() if q == pids[r] and d != r)
                    for u in readings)
                stages[r][msg["stage"]] = msg
                try:
                    os.write(wpipes[r], b"x")
                except OSError:
                    pass
        if time.time() - t0 > timeout:
            error = f"timeout after {timeout}s"
            for p in procs:
                p.kill()
            break
    codes = [p.wait() for p in procs]
    for fd in rpipes + wpipes:
        try:
            os.close(fd)
        except OSError:
            pass
    if error is None and any(codes):
        error = f"exit codes {codes}"
    return stages, peak_own, peak_other, error, time.time() - t0


def rank_record(st, own, other):
    ctx, nccl, built, end = st["context"], st["nccl"], st["built"], st["end"]
    return {
        "nvmlPeakBytes": max(own, end["nvmlProc"]),
        "nvmlEndBytes": end["nvmlProc"],
        "nvmlOtherGpusPeakBytes": other,
        "maxReservedBytes": end["maxReserved"],
        "maxAllocatedBytes": end["maxAllocated"],
        "reservedEndBytes": end["reserved"],
        "contextBytes": ctx["nvmlProc"] - ctx["reserved"],
        "ncclBytes": nccl["nvmlProc"] - nccl["reserved"] - (ctx["nvmlProc"] - ctx["reserved"]),
        "nonAllocatorBytes": end["nvmlProc"] - end["reserved"],
        "builtAllocatedBytes": built["allocated"],
        "builtReservedBytes": built["reserved"],
        "stepSeconds": end["seconds"],
        "allocRetries": end["numAllocRetries"],
        "parameters": built["params"],
    }


def main():
    global WORLD
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        name, rank, wfd, rfd = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        c = next(c for c in configs_for(WORLD) if c["name"] == name)
        code = 0
        try:
            worker(c, rank, wfd, rfd)
        except BaseException as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            print(f"rank {rank} {name}: {type(e).__name__}: {e}"[:2000], file=sys.stderr,
                  flush=True)
            code = 1
        os._exit(code)

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--deadline", type=float, default=400.0)
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per configuration")
    ap.add_argument("--only", default="")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--world", type=int, default=2, help="ranks (one GPU each): 2, 4 or 8")
    args = ap.parse_args()
    WORLD = args.world
    cfgs = [c for c in configs_for(WORLD) if not args.only or c["name"] in args.only.split(",")]
    names = [c["name"] for c in cfgs]
    assert len(names) == len(set(names))
    if args.dry_run:
        for c in cfgs:
            print(json.dumps({"name": c["name"], "split": c["split"], "spec": job_spec(c)}))
        print(f"{len(cfgs)} configurations, {sum(c['split'] == H for c in cfgs)} held out",
              file=sys.stderr)
        return

    import torch
    nvml = Nvml()
    try:
        import deepspeed  # noqa: F401
        ds = "installed"
    except Exception as e:  # noqa: BLE001
        ds = f"not installed ({type(e).__name__})"
    print(f"torch {torch.__version__} gpus {len(nvml.h)} {nvml.name} deepspeed {ds}", flush=True)
    if len(nvml.h) < WORLD:
        sys.exit(f"--world {WORLD} needs {WORLD} GPUs, this machine has {len(nvml.h)}")
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, f"h200x{WORLD}-zero.jsonl")
    t_start = time.time()
    with open(out_path, "w") as f:
        for i, c in enumerate(cfgs):
            if time.time() - t_start > args.deadline:
                print(f"deadline: skipping {c['name']}", flush=True)
                continue
            stages, own, other, err, secs = run_config(c, nvml, 29500 + i, args.timeout)
            line = {"name": c["name"], "split": c["split"], "spec": job_spec(c),
                    "gpu": nvml.name, "gpus": WORLD, "torch": torch.__version__,
                    "snapshot": False}
            if err is None and all("end" in s for s in stages):
                ranks = [rank_record(stages[r], own[r], other[r]) for r in range(WORLD)]
                peak = max(r["nvmlPeakBytes"] for r in ranks)
                line["measured"] = {
                    "nvmlPeakBytes": peak,
                    "maxReservedBytes": max(r["maxReservedBytes"] for r in ranks),
                    "maxAllocatedBytes": max(r["maxAllocatedBytes"] for r in ranks),
                    "parameters": ranks[0]["parameters"],
                    "ranks": ranks,
                }
                f.write(json.dumps(line) + "\n")
                f.flush()
                g = 2 ** 30
                print(f"[{i + 1}/{len(cfgs)}] {c['name']}: nvml "
                      + " / ".join(f"{r['nvmlPeakBytes'] / g:.3f}" for r in ranks)
                      + " GiB reserved "
                      + " / ".join(f"{r['maxReservedBytes'] / g:.3f}" for r in ranks)
                      + f" nccl {ranks[0]['ncclBytes'] / 2**20:.0f} MiB nonalloc "
                      f"{ranks[0]['nonAllocatorBytes'] / 2**20:.0f} MiB other "
                      f"{ranks[0]['nvmlOtherGpusPeakBytes'] / 2**20:.0f} MiB ({secs:.1f}s)",
                      flush=True)
            else:
                line["error"] = err or "a rank did not finish"
                line["stages"] = stages
                print(f"[{i + 1}/{len(cfgs)}] {c['name']}: FAILED {line['error']} ({secs:.1f}s)",
                      flush=True)
                with open(os.path.join(args.out, "errors.jsonl"), "a") as ef:
                    ef.write(json.dumps(line) + "\n")
    print(f"done in {time.time() - t_start:.0f}s -> {out_path}", flush=True)


if __name__ == "__main__":
    main()
