#!/usr/bin/env python3
"""Step time as a function of the micro-batch, at a fixed global batch.

For each model kind of the demo (GPT-2 small, a LLaMA-1B shape, BERT-base,
ResNet-50, ViT-B/16; random weights, nothing downloaded) and each micro-batch
that divides the global batch, trains a few optimizer steps of
`global / micro` micro-steps (forward, backward) and one AdamW step each, under
bf16 autocast, on one synthetic global batch kept on the GPU (so the time is
the GPU's, not the data loader's), and records the median seconds per optimizer
step. The global batch, and so the maths of a step, is the same for every
micro-batch: this is the cost vramfit's OOM back-off and elastic placement pay
for a smaller micro-batch.

Usage:
    python3 scripts/gpu/step_time.py --out FILE.jsonl [--steps 3] [--deadline 420]
    python3 scripts/gpu/step_time.py --smoke       # tiny shapes on the CPU: the code paths only

Output: one JSON line per (model, micro): model, micro, accum, global, steps,
stepSeconds (each timed step), medianStepSeconds, samplesPerSecond,
peakReservedBytes, or error ("oom" when the micro-batch does not fit), plus the
device and library versions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

MICROS = [1, 2, 4, 8, 16, 32, 64]


def kinds(smoke: bool) -> Dict[str, Dict[str, Any]]:
    """Each kind: its global batch and how to build it (small under --smoke)."""
    if smoke:
        return {
            "gpt2": {"global": 4, "seq": 16, "hf": {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64}},
            "bert": {"global": 4, "seq": 16, "hf": {"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 64}},
            "resnet50": {"global": 4, "image": 32, "vision": "resnet18"},
        }
    return {
        "gpt2": {"global": 64, "seq": 1024, "hf": {"model_type": "gpt2"}},
        "llama-1b": {"global": 32, "seq": 2048, "hf": {
            "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}},
        "bert": {"global": 64, "seq": 512, "hf": {"model_type": "bert"}},
        "resnet50": {"global": 256, "image": 224, "vision": "resnet50"},
        "vit-b-16": {"global": 256, "image": 224, "vision": "vit_b_16"},
    }


def build(kind: Dict[str, Any], device: Any) -> Tuple[Any, Callable[[int], Dict[str, Any]], Callable[[Any, Dict[str, Any]], Any]]:
    """The model, a batch maker and a loss function of one kind."""
    import torch

    if "hf" in kind:
        import transformers

        cfg = dict(kind["hf"])
        model_type = cfg.pop("model_type")
        config = transformers.AutoConfig.for_model(model_type, **cfg)
        cls = transformers.AutoModelForMaskedLM if model_type == "bert" else transformers.AutoModelForCausalLM
        model = cls.from_config(config, attn_implementation="sdpa").to(device)
        vocab, seq = config.vocab_size, kind["seq"]

        def batch(samples: int) -> Dict[str, Any]:
            ids = torch.randint(0, vocab, (samples, seq), device=device)
            return {"input_ids": ids, "labels": ids}

        def loss(m: Any, b: Dict[str, Any]) -> Any:
            return m(input_ids=b["input_ids"], labels=b["labels"]).loss

        return model, batch, loss
    import torchvision

    model = torchvision.models.get_model(kind["vision"], weights=None, num_classes=1000).to(device)
    size = kind["image"]

    def batch(samples: int) -> Dict[str, Any]:
        return {
            "images": torch.randn(samples, 3, size, size, device=device),
            "labels": torch.randint(0, 1000, (samples,), device=device),
        }

    def loss(m: Any, b: Dict[str, Any]) -> Any:
        return torch.nn.functional.cross_entropy(m(b["images"]), b["labels"])

    return model, batch, loss


def measure(name: str, kind: Dict[str, Any], micro: int, steps: int, device: Any) -> Dict[str, Any]:
    import torch

    global_batch = kind["global"]
    accum = global_batch // micro
    row: Dict[str, Any] = {"model": name, "micro": micro, "accum": accum, "global": global_batch, "steps": steps}
    model = optimizer = data = None
    try:
        torch.manual_seed(0)
        model, make_batch, loss_fn = build(kind, device)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = make_batch(global_batch)
        cuda = device.type == "cuda"
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)

        def step() -> None:
            for i in range(accum):
                part = {k: v[i * micro:(i + 1) * micro] for k, v in data.items()}
                with autocast:
                    loss = loss_fn(model, part) / accum
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # warm-up: kernels chosen, allocator filled, optimizer state made
        if cuda:
            torch.cuda.synchronize()
        wait_for_the_others()
        times: List[float] = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        row.update(
            stepSeconds=[round(t, 5) for t in times],
            medianStepSeconds=round(median, 5),
            samplesPerSecond=round(global_batch / median, 2),
            peakReservedBytes=torch.cuda.max_memory_reserved() if cuda else None,
        )
    except torch.OutOfMemoryError:
        row["error"] = "oom"
    finally:
        del model, optimizer, data
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return row


BARRIER: Dict[str, Any] = {}


def wait_for_the_others() -> None:
    """With --barrier DIR --copies K (K processes sharing the GPU): say this
    one is warm, then wait until all K are, so that the timed steps of all
    of them run together."""
    if not BARRIER:
        return
    import os

    os.makedirs(BARRIER["dir"], exist_ok=True)
    open(os.path.join(BARRIER["dir"], f"ready-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 300
    while len(os.listdir(BARRIER["dir"])) < BARRIER["copies"] and time.monotonic() < deadline:
        time.sleep(0.05)


def has_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON lines file to append to (default: standard output)")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps per micro-batch")
    p.add_argument("--deadline", type=float, default=420.0, help="seconds; kinds not started by then are skipped")
    p.add_argument("--only", help="comma-separated kinds to run")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    p.add_argument("--micros", help="comma-separated micro-batches to run (default: every divisor)")
    p.add_argument("--barrier", help="with --copies: a folder where the copies sharing the GPU "
                                     "meet before their timed steps")
    p.add_argument("--copies", type=int, default=1, help="processes sharing the GPU (recorded)")
    args = p.parse_args()
    if args.barrier:
        BARRIER.update(dir=args.barrier, copies=args.copies)
    micros = [int(m) for m in args.micros.split(",")] if args.micros else MICROS

    import torch

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    versions = {"torch": torch.__version__}
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:
        pass
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    out = open(args.out, "a", encoding="utf-8") if args.out else sys.stdout
    started = time.monotonic()
    only = set(args.only.split(",")) if args.only else None
    for name, kind in kinds(args.smoke).items():
        if only and name not in only:
            continue
        if "vision" in kind and not has_torchvision():
            print(f"step_time: {name} skipped: torchvision is not installed", file=sys.stderr)
            continue
        for micro in [m for m in micros if kind["global"] % m == 0]:
            if time.monotonic() - started > args.deadline:
                print(f"step_time: deadline passed, {name} micro {micro} and later skipped", file=sys.stderr)
                return 0
            row = measure(name, kind, micro, args.steps, device)
            row.update(device=gpu, copies=args.copies, **versions)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"step_time: {name} micro {micro}: {row.get('medianStepSeconds', row.get('error'))}", file=sys.stderr)
            if row.get("error") == "oom":
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
