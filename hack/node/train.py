#!/usr/bin/env python3
"""The GPU node demo's training program: real models, synthetic data, N steps.

Runs inside the training pods of hack/gpunode.sh demo with the vramfit helper
(python/) on PYTHONPATH: `vramfit.configure()` applies the attempt's budget
before CUDA is touched and gives the batch shape, `vramfit.oom_guard()` turns a
CUDA OOM into the exit protocol (exit 42, message in /dev/termination-log).

    train.py --model gpt2|llama|resnet50 [--steps N] [--seq-len L] [--hf-config F]
    train.py --model bypass --bypass-bytes B      allocates outside PyTorch (cuMemAlloc), then waits

Every line it prints that starts with `vramfit-train:` is a JSON event the
demo reads from the pod log: `start`, `step` (the first and every tenth),
`oom` (just before the exit protocol), `done`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time


def event(kind: str, **fields) -> None:
    fields.update(event=kind, unixMs=int(time.time() * 1000))
    print("vramfit-train: " + json.dumps(fields, sort_keys=True), flush=True)


def build_model(args, torch):
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        if args.tiny:  # the CPU run on a machine without a GPU
            config = GPT2Config(n_positions=args.seq_len, n_embd=64, n_layer=2, n_head=2, vocab_size=1000)
        else:
            config = GPT2Config(n_positions=args.seq_len, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
        config._attn_implementation = "sdpa"
        return GPT2LMHeadModel(config), "tokens", config.vocab_size
    if args.model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = json.loads(args.hf_config) if args.hf_config else {}
        cfg.pop("architectures", None)
        cfg.pop("model_type", None)
        cfg.pop("torch_dtype", None)
        config = LlamaConfig(**cfg)
        config._attn_implementation = "sdpa"
        model = LlamaForCausalLM(config)
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
        return model, "tokens", config.vocab_size
    if args.model == "resnet50":
        import torchvision

        return torchvision.models.resnet50(num_classes=1000), "images", 1000
    raise SystemExit(f"unknown model {args.model}")


def bypass(nbytes: int, hold_seconds: float) -> int:
    """Allocates `nbytes` through the CUDA driver directly, where neither
    PyTorch's allocator nor its memory fraction can see it, and holds it. The
    node agent's watchdog is what stops this process."""
    import torch

    torch.zeros(1, device="cuda")  # the primary context, made current by PyTorch
    cuda = ctypes.CDLL("libcuda.so.1")
    chunk = 1 << 30
    ptrs = []
    held = 0
    while held < nbytes:
        ptr = ctypes.c_uint64()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(chunk))
        if rc != 0:
            event("bypass-alloc-failed", heldBytes=held, cudaError=rc)
            break
        ptrs.append(ptr)
        held += chunk
    event("bypass", heldBytes=held)
    deadline = time.time() + hold_seconds
    while time.time() < deadline:
        time.sleep(0.5)
    event("bypass-survived", heldBytes=held)
    return 3


def cap_eff() -> str:
    """The process's effective capabilities (hex, /proc/self/status): a
    privileged container has them all, CAP_SYS_ADMIN among them."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return line.split()[1]
    except OSError:
        pass
    return ""


def memory(torch, device) -> dict:
    if device.type != "cuda":
        return {}
    return {"maxAllocatedBytes": torch.cuda.max_memory_allocated(), "maxReservedBytes": torch.cuda.max_memory_reserved()}


def train(args, attempt, torch, device) -> None:
    model, kind, classes = build_model(args, torch)
    model.to(device).train()
    if kind == "images":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    micro, accum = attempt.micro_batch, attempt.grad_accum
    if args.absorb:
        return train_absorbing(args, attempt, torch, device, model, opt, kind, classes)
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(accum):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                if kind == "tokens":
                    ids = torch.randint(0, classes, (micro, args.seq_len), device=device)
                    loss = model(input_ids=ids, labels=ids).loss
                else:
                    x = torch.randn(micro, 3, args.image_size, args.image_size, device=device)
                    y = torch.randint(0, classes, (micro,), device=device)
                    loss = torch.nn.functional.cross_entropy(model(x), y)
            (loss / accum).backward()
            loss_sum += loss.item()
        opt.step()
        if step == 1 or step % 10 == 0 or step == args.steps:
            event("step", step=step, loss=round(loss_sum / accum, 4), **memory(torch, device))


def train_absorbing(args, attempt, torch, device, model, opt, kind, classes) -> None:
    """The same steps through vramfit.Step: an OOM inside a step halves the
    micro-batch in this process (down to the job's minMicro), re-runs the
    step with the same global batch, and the helper publishes the new shape
    (shape-<pid>.json) for the agent; no new pod."""
    import vramfit

    step_runner = vramfit.Step(model, opt, attempt=attempt)
    if kind != "tokens":
        raise SystemExit("--absorb takes a language model")

    def loss_fn(m, batch):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return m(input_ids=batch["ids"], labels=batch["ids"]).loss

    for step in range(1, args.steps + 1):
        ids = torch.randint(0, classes, (attempt.global_batch, args.seq_len), device=device)
        result = step_runner.run({"ids": ids}, loss_fn)
        for oom in result.absorbed:
            event("absorbed", step=step, fromMicro=oom.from_micro, toMicro=oom.to_micro,
                  recoverySeconds=round(result.recovery_seconds, 3))
        if step == 1 or step % 10 == 0 or step == args.steps or result.absorbed:
            event("step", step=step, loss=round(result.loss, 4), micro=result.micro_batch,
                  absorbed=len(result.absorbed), **memory(torch, device))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=["gpt2", "llama", "resnet50", "bypass"])
    p.add_argument("--steps", type=int, default=int(os.environ.get("VRAMFIT_DEMO_STEPS", "20")))
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--hf-config", help="the model's Hugging Face config.json, as JSON text")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="a small GPT-2 (with --device cpu)")
    p.add_argument("--bypass-bytes", type=int, default=0)
    p.add_argument("--bypass-attempts", type=int, default=1, help="attempts (from 1) that bypass; later ones train gpt2")
    p.add_argument("--hold-seconds", type=float, default=240)
    p.add_argument("--absorb", action="store_true", help="absorb OOMs in the process (vramfit.Step)")
    args = p.parse_args(argv)

    import vramfit

    attempt = vramfit.configure(micro_batch=8, grad_accum=1)
    # What CDI gave this container: its GPU device nodes (or, on a machine
    # without GPUs, the simulated GPU's variable).
    devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    event("start", model=args.model, attempt=attempt.attempt, micro=attempt.micro_batch,
          accum=attempt.grad_accum, budgetBytes=attempt.budget_bytes, enforcement=attempt.enforcement,
          devices=devices, simulatedGpu=os.environ.get("VRAMFIT_SIMULATED_GPU"), capEff=cap_eff())
    if args.model == "bypass":
        if attempt.attempt <= args.bypass_attempts:
            return bypass(args.bypass_bytes or 2 * (attempt.budget_bytes or 8 << 30), args.hold_seconds)
        args.model = "gpt2"

    import torch

    torch.manual_seed(0)
    device = torch.device(args.device)
    with vramfit.oom_guard():
        try:
            train(args, attempt, torch, device)
        except BaseException as exc:  # the OOM's time; the guard then runs the exit protocol
            if vramfit.is_oom(exc):
                # budgetOom: raised by vramfit's allocator at the budget (not
                # by the driver running out, nor by PyTorch's memory fraction).
                from vramfit.allocator import is_budget_oom

                event("oom", micro=attempt.micro_batch, budgetOom=is_budget_oom(exc))
            raise
    event("done", steps=args.steps, **memory(torch, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
