#!/usr/bin/env python3
"""cuDNN's convolution workspaces, measured one convolution at a time.

A convolution on a CUDA GPU takes a workspace from PyTorch's caching
allocator for the call (`run_conv_plan`) and gives it back after the kernel:
the forward, and in backward the input's and the weight's gradients, each
their own. A CPU capture has no cuDNN, so it cannot see them; the predictor
computes them from the call's shape (src/predict/conv.rs), and this script
measures them on the GPU to check it.

For each convolution shape (those of torchvision's classification models at
the calibration sets' batch sizes and precisions, then a seeded random grid)
it runs the forward and the backward alone, with the allocator's history
recorded, and writes every allocation that was freed inside the call (the
workspaces) and every one that was not (the outputs), in the order made.

    python3 scripts/gpu/conv_workspaces.py --out OUT/conv-workspaces.jsonl [--grid 400] [--seed 7]
    python3 scripts/gpu/conv_workspaces.py --out OUT/conv-batches.jsonl --grid 0 \
        --batches 16,32,48,64,96,128 [--dtypes fp32,bf16,fp16] [--count]

With --batches, every model's shapes (MODELS and BATCH_MODELS) are measured at
each of those batch sizes in each dtype instead of the calibration sets' pairs:
cuDNN's heuristics pick kernels by the whole shape, batch included, so a rule
fitted at one batch can miss another (VGG-16 in fp32 at 64). --count prints
how many shapes that is, without a GPU.

One line per (shape, dtype): the shape (N, C, H, W, K, R, S, stride,
padding, dilation, groups, whether the input is channels-last as the model
hands it over), dtype, "forward": {"transient": [bytes...], "kept":
[bytes...], "order": [[bytes, freed], ...] as made}, "backward": the same,
and the run's versions.
"""

import argparse
import json
import random
import sys
import time

import torch
import torchvision

MODELS = {  # model: image size, (batch, dtype) pairs of the calibration sets and two more
    "vgg11_bn": (224, [(32, "fp32")]),
    "vgg16_bn": (224, [(32, "fp32"), (16, "bf16")]),
    "resnet18": (224, [(128, "fp32"), (256, "bf16")]),
    "resnet34": (224, [(96, "bf16"), (64, "fp32")]),
    "resnet50": (224, [(64, "fp32"), (64, "bf16"), (128, "bf16"), (128, "fp16")]),
    "resnet101": (224, [(64, "fp16")]),
    "convnext_tiny": (224, [(32, "fp32"), (48, "fp32"), (64, "bf16"), (64, "fp16")]),
    "convnext_small": (224, [(48, "fp32"), (32, "bf16")]),
    "densenet121": (224, [(64, "fp32"), (64, "bf16"), (64, "fp16")]),
    "efficientnet_b0": (224, [(64, "fp32"), (64, "bf16"), (128, "bf16"), (128, "fp16")]),
    "mobilenet_v2": (224, [(128, "fp32"), (256, "bf16")]),
    "mobilenet_v3_large": (224, [(128, "bf16"), (128, "fp16"), (256, "bf16")]),
    "regnet_y_800mf": (224, [(96, "bf16"), (64, "fp32")]),
    "wide_resnet50_2": (224, [(32, "fp32")]),
    "resnext50_32x4d": (224, [(64, "bf16"), (32, "fp32")]),
}
# More models for the --batches sweep: the families the calibration sets
# ran beyond MODELS (VGG without batch norm, deeper ResNets and ResNeXts,
# AlexNet, SqueezeNet, MNASNet, larger RegNets, DenseNets and ConvNeXts).
BATCH_MODELS = ["vgg11", "vgg13", "vgg16", "vgg19", "vgg13_bn", "vgg19_bn", "resnet152",
                "resnext101_32x8d", "wide_resnet101_2", "densenet201", "convnext_base",
                "regnet_y_1_6gf", "regnet_y_3_2gf", "mnasnet1_0", "alexnet", "squeezenet1_1"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def model_shapes(name, image):
    """Every Conv2d call of one forward at batch 1: (C, H, W, K, R, S, stride,
    padding, dilation, groups, bias)."""
    model = getattr(torchvision.models, name)()
    seen = []

    def hook(mod, inp, _out):
        x = inp[0]
        seen.append((mod.in_channels, x.shape[2], x.shape[3], mod.out_channels,
                     mod.kernel_size[0], mod.kernel_size[1], mod.stride[0], mod.padding[0],
                     mod.dilation[0], mod.groups, mod.bias is not None, channels_last(x)))

    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, 3, image, image))
    return seen


def channels_last(x):
    """True when the input is laid out channels-last (as ConvNeXt's blocks
    hand their convolutions a permuted tensor), which is what makes ATen
    give a depthwise convolution to cuDNN."""
    return (not x.is_contiguous()) and x.is_contiguous(memory_format=torch.channels_last)


def grid(count, seed):
    rnd = random.Random(seed)
    out = []
    while len(out) < count:
        c = rnd.choice([3, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024])
        k = rnd.choice([16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048])
        h = rnd.choice([7, 14, 28, 56, 112, 224])
        r = rnd.choice([1, 1, 3, 3, 3, 5, 7])
        stride = rnd.choice([1, 1, 2])
        depthwise = rnd.random() < 0.2 and c > 3
        groups, k = (c, c) if depthwise else (1, k)
        n = rnd.choice([8, 16, 32, 64, 128])
        dtype = rnd.choice(list(DTYPES))
        if n * max(c, k) * h * h * 4 > 2 << 30:
            continue
        cl = rnd.random() < 0.3
        out.append(((c, h, h, k, r, r, stride, r // 2, 1, groups, False, cl), n, dtype, "grid"))
    return out


def window(fn):
    """Runs fn with the allocator's history recorded: the allocations freed
    inside it and the ones kept, requested bytes, in order."""
    torch.cuda.synchronize()
    try:
        torch.cuda.memory._record_memory_history(max_entries=100000, context=None,
                                                 stacks="python", clear_history=True)
    except TypeError:  # a PyTorch without clear_history
        torch.cuda.memory._record_memory_history(max_entries=100000, context=None,
                                                 stacks="python")
    out = fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][torch.cuda.current_device()]
    live = {}
    order = []
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = len(order)
            order.append([e["size"], False])
        elif e["action"] in ("free_requested", "free_completed") and e["addr"] in live:
            order[live.pop(e["addr"])][1] = True
    return out, {"transient": [s for s, freed in order if freed],
                 "kept": [s for s, freed in order if not freed],
                 "order": [[s, 1 if freed else 0] for s, freed in order]}


def measure(shape, n, dtype):
    c, h, w, k, r, s, stride, pad, dil, groups, bias, cl = shape
    dt = DTYPES[dtype]
    dev = "cuda"
    conv = torch.nn.Conv2d(c, k, (r, s), stride, pad, dil, groups, bias=bias).to(dev, dt)
    x = torch.randn(n, c, h, w, device=dev, dtype=dt)
    if cl:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    y, fwd = window(lambda: conv(x))
    g = torch.randn_like(y)
    _, bwd = window(lambda: y.backward(g))
    out = {"forward": fwd, "backward": bwd, "outputBytes": y.numel() * y.element_size()}
    del conv, x, y, g
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--grid", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--batches", help="comma-separated batch sizes: every model's shapes at each")
    ap.add_argument("--dtypes", default="fp32,bf16,fp16", help="with --batches")
    ap.add_argument("--count", action="store_true", help="print the number of shapes and stop")
    ap.add_argument("--deadline", type=float, help="seconds after which no new shape starts")
    args = ap.parse_args()
    cases = []
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
        dtypes = args.dtypes.split(",")
        shapes = [(sh, name) for name in [*BATCH_MODELS, *MODELS]
                  for sh in dict.fromkeys(model_shapes(name, MODELS.get(name, (224,))[0]))]
        # one dtype at a time, so that a deadline cuts the last dtype's shapes
        cases += [(sh, n, dtype, name) for dtype in dtypes for sh, name in shapes
                  for n in batches if n * max(sh[0], sh[3]) * sh[1] * sh[2] * 4 <= 2 << 30]
    else:
        for name, (image, runs) in MODELS.items():
            shapes = list(dict.fromkeys(model_shapes(name, image)))
            for n, dtype in runs:
                cases += [(sh, n, dtype, name) for sh in shapes]
    cases += grid(args.grid, args.seed)
    if args.count:
        print(len({(sh, n, dtype) for sh, n, dtype, _ in cases}))
        return
    versions = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "cudnn": torch.backends.cudnn.version(),
                "allowTf32": torch.backends.cudnn.allow_tf32,
                "benchmark": torch.backends.cudnn.benchmark}
    done = set()
    t0 = time.time()
    with open(args.out, "w") as f:
        for i, (shape, n, dtype, origin) in enumerate(cases):
            key = (shape, n, dtype)
            if key in done:
                continue
            if args.deadline and time.time() - t0 > args.deadline:
                print(f"deadline: stopped before {i}/{len(cases)}", file=sys.stderr)
                break
            done.add(key)
            row = {"origin": origin, "n": n, "dtype": dtype,
                   "shape": dict(zip(("c", "h", "w", "k", "r", "s", "stride", "padding",
                                      "dilation", "groups", "bias", "channelsLast"), shape))}
            try:
                row.update(measure(shape, n, dtype))
            except torch.OutOfMemoryError as e:
                row["error"] = f"OutOfMemoryError: {str(e)[:200]}"
            torch.cuda.empty_cache()
            row["versions"] = versions
            f.write(json.dumps(row) + "\n")
            f.flush()
            if i % 200 == 0:
                print(f"{i}/{len(cases)} {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    print(f"{len(done)} shapes in {time.time() - t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
