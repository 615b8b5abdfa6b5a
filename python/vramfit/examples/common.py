"""The loop every example shares: configure, build, train with vramfit.Step, report.

The data are synthetic and a pure function of ``(seed, step)``: every optimizer
step sees the same global batch whatever the micro-batch, so runs with
different shapes are comparable sample for sample.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, Optional

import vramfit

Batch = Dict[str, Any]


def parser(description: str, *, micro: int, global_batch: int, lr: float) -> argparse.ArgumentParser:
    """The arguments every example takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--micro", type=int, default=micro, help="micro-batch outside vramfit")
    p.add_argument("--global-batch", type=int, default=global_batch, help="global batch outside vramfit")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
        help="fp32, or autocast to bf16 / fp16 (fp16 with a GradScaler)",
    )
    p.add_argument(
        "--optimizer", choices=["adamw", "adam", "sgd-momentum", "sgd"], default="adamw",
        help="the TrainingJob's spec.model.optimizer",
    )
    p.add_argument("--absorb", action="store_true", help="absorb OOMs inside the process (vramfit.Step)")
    p.add_argument("--events", help="append one JSON line per event (ready, step, done) to this file")
    p.add_argument("--save-params", help="save the final parameters here (torch.save)")
    p.add_argument("--save-init", help="save the initial parameters here (torch.save)")
    p.add_argument("--eval-samples", type=int, default=8, help="samples of the final held-out loss")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument(
        "--dropout", type=float, default=None,
        help="set every dropout probability of the model's config (0 makes runs of different "
        "micro-batches comparable: dropout masks depend on how the batch is split)",
    )
    return p


def set_dropout(config: Any, probability: Optional[float]) -> None:
    """Sets every dropout probability of a Hugging Face config (``*dropout*``, ``*pdrop``)."""
    if probability is None:
        return
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop")):
            setattr(config, name, probability)


class Events:
    """JSON lines with wall-clock times, for benchmarks that compare runs."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "t": time.time(), "pid": os.getpid(), **fields}
        if self.path:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
        if event != "step" or fields.get("step", 0) % 10 == 1 or fields.get("absorbed"):
            print(json.dumps(record), file=sys.stderr)


def run(
    args: argparse.Namespace,
    *,
    build_model: Callable[[], Any],
    make_batch: Callable[[Any, int], Batch],
    loss_fn: Callable[[Any, Batch], Any],
) -> None:
    """Configures the attempt, builds the model and trains ``args.steps`` steps.

    ``make_batch(generator, samples)`` draws synthetic samples on the CPU;
    ``loss_fn(model, batch)`` returns the mean loss of a micro-batch.
    """
    import torch  # noqa: F401  (imported before configure(), which then sets the budget)

    attempt = vramfit.configure(micro_batch=args.micro, global_batch=args.global_batch)
    with vramfit.oom_guard():
        _train(args, attempt, build_model, make_batch, loss_fn)


def _train(
    args: argparse.Namespace,
    attempt: vramfit.Attempt,
    build_model: Callable[[], Any],
    make_batch: Callable[[Any, int], Batch],
    loss_fn: Callable[[Any, Batch], Any],
) -> None:
    import torch

    events = Events(args.events)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device.index or attempt.local_rank)
    torch.manual_seed(args.seed)
    model = build_model().to(device)
    model.train()
    if args.save_init:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save_init)
    optimizer = _optimizer(args, model.parameters())
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None

    def micro_loss(m: Any, batch: Batch) -> Any:
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            return loss_fn(m, batch)

    # Without --absorb the floor is the attempt's own micro-batch: the first OOM
    # follows the exit protocol and the controller's restart path takes over.
    floor = attempt.min_micro_batch if args.absorb else attempt.micro_batch
    step = vramfit.Step(model, optimizer, scaler, attempt=attempt, min_micro_batch=floor)
    rank_batch = attempt.global_batch // attempt.world_size
    rank = int(os.environ.get("RANK", "0"))
    events.emit(
        "ready", attempt=attempt.attempt, micro=attempt.micro_batch, accum=attempt.grad_accum,
        global_batch=attempt.global_batch, enforcement=attempt.enforcement, device=str(device),
    )
    for index in range(1, args.steps + 1):
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + index)
        batch = make_batch(generator, attempt.global_batch)
        batch = {k: v[rank * rank_batch:(rank + 1) * rank_batch].to(device, non_blocking=True) for k, v in batch.items()}
        result = step.run(batch, micro_loss)
        events.emit(
            "step", step=index, loss=result.loss, micro=result.micro_batch, accum=step.grad_accum,
            absorbed=len(result.absorbed), recovery_s=result.recovery_seconds,
            peak_reserved=torch.cuda.max_memory_reserved() if device.type == "cuda" else None,
        )
    eval_loss = _held_out_loss(model, make_batch, micro_loss, args, step.micro_batch, device)
    if args.save_params:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save_params)
    events.emit("done", eval_loss=eval_loss, micro=step.micro_batch, accum=step.grad_accum, steps=args.steps)


def _optimizer(args: argparse.Namespace, params: Any) -> Any:
    import torch

    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=args.lr)
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=args.lr)
    return torch.optim.SGD(params, lr=args.lr, momentum=0.9 if args.optimizer == "sgd-momentum" else 0.0)


def _held_out_loss(model: Any, make_batch: Any, micro_loss: Any, args: Any, micro: int, device: Any) -> float:
    import torch

    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + 999_999)
    batch = make_batch(generator, args.eval_samples)
    total = 0.0
    with torch.no_grad():
        for chunk, samples in vramfit.split_batch(batch, micro):
            chunk = {k: v.to(device) for k, v in chunk.items()}
            total += float(micro_loss(model, chunk)) * samples / args.eval_samples
    return total
