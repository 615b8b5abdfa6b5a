#!/usr/bin/env python3
"""The GPU node demo's training program: real models, synthetic data, N steps.

Runs inside the training pods of hack/gpunode.sh demo with the vramfit helper
(python/) on PYTHONPATH: `vramfit.configure()` applies the attempt's budget
before CUDA is touched and gives the batch shape, `vramfit.oom_guard()` turns a
CUDA OOM into the exit protocol (exit 42, message in /dev/termination-log).

    train.py --model gpt2|llama|resnet50 [--steps N] [--seq-len L] [--hf-config F]
    train.py --model opt [--steps N] [--seq-len L]   OPT-125m's shape, stepped by vramfit.Step
    train.py --model bypass --bypass-bytes B      allocates outside PyTorch (cuMemAlloc), then waits
    train.py --model gpt2 --exact [--steps N]     the same maths at any batch shape (below)

`--exact` (GPT-2): fp32 with TF32 off, no dropout, each optimizer step's
global batch drawn on the CPU from a generator seeded by the step and split
into the attempt's micro-batches, and a held-out loss after the steps (on a
batch drawn the same way, in the `done` event as `evalLoss`): two runs of
one job at different micro-batch x accumulation shapes differ only in the
order of floating-point sums, so their held-out losses agree within 1e-3
(the in-process recovery test's tolerance). The elastic check of the chart
run compares them.

`--model opt` (and `--absorb`) train through `vramfit.Step`; the other
models through a plain loop. Under VRAMFIT_PHASE=profile (the controller's
automatic profiling: a pod without a GPU) nothing trains: the model is built
on the meta device, the first step is captured on the CPU under fake tensors
(vramfit.Step does it itself; the plain loop calls
vramfit.profile.capture_step), the helper prints `vramfit-profile: ...` and
the process exits 0 (3 when the capture fails).

Every line it prints that starts with `vramfit-train:` is a JSON event the
demo reads from the pod log: `start` (with `phase`: train or profile),
`step` (the first and every tenth), `absorbed`, `profile-capture` (the step
about to be captured, in the profile phase), `oom` (just before the exit
protocol), `done`.
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

        # --exact: no dropout, so that the shape alone cannot change the maths.
        drop = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0} if args.exact else {}
        if args.tiny:  # the CPU run on a machine without a GPU
            config = GPT2Config(n_positions=args.seq_len, n_embd=64, n_layer=2, n_head=2, vocab_size=1000, **drop)
        else:
            config = GPT2Config(n_positions=args.seq_len, n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                                **drop)
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
    if args.model == "opt":
        # A family the controller's analytic predictor does not know: a job
        # of it is profiled (model.auto). OPT-125m's shape, or a tiny one.
        from transformers import OPTConfig, OPTForCausalLM

        if args.tiny:
            config = OPTConfig(hidden_size=64, num_hidden_layers=2, ffn_dim=256, num_attention_heads=2,
                               vocab_size=1000, max_position_embeddings=max(args.seq_len, 128), word_embed_proj_dim=64)
        else:
            if args.seq_len > 2048:
                raise SystemExit(f"--model opt: --seq-len {args.seq_len} is more than its 2048 positions")
            config = OPTConfig(hidden_size=768, num_hidden_layers=12, ffn_dim=3072, num_attention_heads=12,
                               vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=768)
        config._attn_implementation = "sdpa"
        return OPTForCausalLM(config), "tokens", config.vocab_size
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


def make_optimizer(args, torch, model, kind, device):
    if kind == "images":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if args.model == "opt":
        # foreach: PyTorch's default for CUDA parameters, and what the profile
        # phase then captures (on CPU parameters the default is the
        # per-tensor loop, whose temporaries are smaller).
        return torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=True)
    return torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")


def train(args, attempt, torch, device, profiling=False) -> None:
    """Trains; with `profiling` (VRAMFIT_PHASE=profile) captures the first
    step instead and ends the process (never returns). The caller prints the
    `done` event, except with --exact, which prints its own."""
    if profiling:
        # No weights in memory: the capture gives the parameters fake storage.
        with torch.device("meta"):
            model, kind, classes = build_model(args, torch)
    else:
        model, kind, classes = build_model(args, torch)
        model.to(device)
    model.train()
    opt = make_optimizer(args, torch, model, kind, device)
    # CUDA's autocast also in the profile phase: the capture runs it on the
    # CPU with CUDA's rules.
    amp = "cuda" if profiling or device.type == "cuda" else "cpu"
    if args.absorb or args.model == "opt":
        return train_step_api(args, attempt, torch, device, model, opt, kind, classes, amp, profiling)
    micro, accum = attempt.micro_batch, attempt.grad_accum
    if args.exact:
        return train_exact(args, torch, device, model, opt, classes, micro, accum)

    def one_step(m) -> float:
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(accum):
            with torch.autocast(amp, dtype=torch.bfloat16):
                if kind == "tokens":
                    ids = torch.randint(0, classes, (micro, args.seq_len), device=device)
                    loss = m(input_ids=ids, labels=ids).loss
                else:
                    x = torch.randn(micro, 3, args.image_size, args.image_size, device=device)
                    y = torch.randint(0, classes, (micro,), device=device)
                    loss = torch.nn.functional.cross_entropy(m(x), y)
            (loss / accum).backward()
            loss_sum += loss.item()
        opt.step()
        return loss_sum / accum

    if profiling:
        from vramfit import profile

        event("profile-capture", model=args.model, micro=micro, accum=accum, api="capture_step")
        profile.finish_profile_phase(lambda: profile.capture_step(
            model, one_step, micro_batch=micro, grad_accum=accum, optimizers=[opt], source=f"train.py {args.model}"))
    for step in range(1, args.steps + 1):
        loss = one_step(model)
        if step == 1 or step % 10 == 0 or step == args.steps:
            event("step", step=step, loss=round(loss, 4), **memory(torch, device))


def exact_batch(torch, seed: int, rows: int, seq_len: int, classes: int):
    """`rows` samples of token ids from a CPU generator seeded by `seed`:
    the same samples whatever the micro-batch that will consume them."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, classes, (rows, seq_len), generator=g)


def train_exact(args, torch, device, model, opt, classes, micro, accum) -> None:
    """--exact: fp32, TF32 off, each step's global batch drawn on the CPU
    and split into `accum` micro-batches of `micro`, a held-out loss at the
    end (event `done`, `evalLoss`)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = micro * accum
    for step in range(1, args.steps + 1):
        batch = exact_batch(torch, 1000 + step, rows, args.seq_len, classes)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for chunk in batch.split(micro):
            ids = chunk.to(device)
            # Each micro-batch's mean loss weighted by its share of the step's samples.
            loss = model(input_ids=ids, labels=ids).loss * (len(chunk) / rows)
            loss.backward()
            loss_sum += loss.item()
        opt.step()
        event("step", step=step, loss=round(loss_sum, 6), micro=micro, accum=accum, **memory(torch, device))
    model.eval()
    held = exact_batch(torch, 7, rows, args.seq_len, classes)
    with torch.no_grad():
        total = sum(model(input_ids=c.to(device), labels=c.to(device)).loss.item() * len(c) for c in held.split(micro))
    event("done", steps=args.steps, evalLoss=total / rows, micro=micro, accum=accum, **memory(torch, device))


def train_step_api(args, attempt, torch, device, model, opt, kind, classes, amp, profiling) -> None:
    """The steps through vramfit.Step: an OOM inside a step halves the
    micro-batch in this process (down to the job's minMicro), re-runs the
    step with the same global batch, and the helper publishes the new shape
    (shape-<pid>.json) for the agent; no new pod. Under VRAMFIT_PHASE=profile
    the first `run` captures the step and ends the process."""
    import vramfit

    step_runner = vramfit.Step(model, opt, attempt=attempt)
    if kind != "tokens":
        raise SystemExit("--absorb and vramfit.Step here take a language model")

    def loss_fn(m, batch):
        with torch.autocast(amp, dtype=torch.bfloat16):
            return m(input_ids=batch["ids"], labels=batch["ids"]).loss

    for step in range(1, args.steps + 1):
        ids = torch.randint(0, classes, (attempt.global_batch, args.seq_len), device=device)
        if profiling and step == 1:
            event("profile-capture", model=args.model, micro=step_runner.micro_batch,
                  globalBatch=attempt.global_batch, api="vramfit.Step")
        result = step_runner.run({"ids": ids}, loss_fn)
        for oom in result.absorbed:
            event("absorbed", step=step, fromMicro=oom.from_micro, toMicro=oom.to_micro,
                  recoverySeconds=round(result.recovery_seconds, 3))
        if step == 1 or step % 10 == 0 or step == args.steps or result.absorbed:
            event("step", step=step, loss=round(result.loss, 4), micro=result.micro_batch,
                  absorbed=len(result.absorbed), **memory(torch, device))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=["gpt2", "llama", "resnet50", "opt", "bypass"])
    p.add_argument("--steps", type=int, default=int(os.environ.get("VRAMFIT_DEMO_STEPS", "20")))
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--hf-config", help="the model's Hugging Face config.json, as JSON text")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="a small GPT-2 or OPT (with --device cpu)")
    p.add_argument("--bypass-bytes", type=int, default=0)
    p.add_argument("--bypass-attempts", type=int, default=1, help="attempts (from 1) that bypass; later ones train gpt2")
    p.add_argument("--hold-seconds", type=float, default=240)
    p.add_argument("--absorb", action="store_true", help="absorb OOMs in the process (vramfit.Step)")
    p.add_argument("--exact", action="store_true",
                   help="GPT-2: the same maths at any batch shape, a held-out loss at the end")
    args = p.parse_args(argv)

    import vramfit
    from vramfit.profile import profile_phase

    # The controller's profile phase (model.auto): no GPU, the step captured on the CPU.
    profiling = profile_phase()
    attempt = vramfit.configure(micro_batch=8, grad_accum=1)
    # What CDI gave this container: its GPU device nodes (or, on a machine
    # without GPUs, the simulated GPU's variable).
    devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    event("start", model=args.model, attempt=attempt.attempt, micro=attempt.micro_batch,
          accum=attempt.grad_accum, budgetBytes=attempt.budget_bytes, enforcement=attempt.enforcement,
          devices=devices, simulatedGpu=os.environ.get("VRAMFIT_SIMULATED_GPU"), capEff=cap_eff(),
          phase="profile" if profiling else "train")
    if args.model == "bypass" and profiling:
        args.model = "gpt2"  # nothing to profile in an allocation outside PyTorch: its later attempts' model
    if args.model == "bypass":
        if attempt.attempt <= args.bypass_attempts:
            return bypass(args.bypass_bytes or 2 * (attempt.budget_bytes or 8 << 30), args.hold_seconds)
        args.model = "gpt2"

    import torch

    torch.manual_seed(0)
    device = torch.device("cpu" if profiling else args.device)
    with vramfit.oom_guard():
        try:
            train(args, attempt, torch, device, profiling)
        except BaseException as exc:  # the OOM's time; the guard then runs the exit protocol
            if vramfit.is_oom(exc):
                # budgetOom: raised by vramfit's allocator at the budget (not
                # by the driver running out, nor by PyTorch's memory fraction).
                from vramfit.allocator import is_budget_oom

                event("oom", micro=attempt.micro_batch, budgetOom=is_budget_oom(exc))
            raise
    if not args.exact:
        event("done", steps=args.steps, **memory(torch, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
