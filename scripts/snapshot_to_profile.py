#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot into a vramfit allocation profile.

The snapshot is what `torch.cuda.memory._dump_snapshot(path)` writes after
`torch.cuda.memory._record_memory_history()`; the profile is the compact format
described in docs/profile-format.md (`"format": "vramfit.profile/v1"`).
Only the standard library is needed: the snapshot is a pickle of plain
dicts and lists, so no PyTorch is required to convert it.

Usage:
    python3 scripts/snapshot_to_profile.py SNAPSHOT.pickle --micro-batch 8 \
        [--grad-accum 1] [--device 0] [-o PROFILE.json]
"""

import argparse
import json
import pickle
import sys

FORMAT = "vramfit.profile/v1"


def device_trace(snapshot, device):
    """The device's trace and the actions that free a tensor in it: a block
    is back in the cache at `free_completed` when the trace has those,
    else at `free_requested`."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    frees = {"free_completed"} if any(e["action"] == "free_completed" for e in trace) \
        else {"free_requested"}
    return trace, frees


def convert(snapshot, micro_batch, grad_accum=1, device=0, source=None):
    """Returns the profile (a dict) of one device's trace in `snapshot`.

    Tensor allocations and frees only: segment events are the allocator's own
    decisions, which the predictor re-makes with its allocator model. A block
    freed in the trace but allocated before recording started, or still live in
    the snapshot's segments without an allocation in the trace, becomes an
    allocation at the start of the profile.
    """
    trace, frees = device_trace(snapshot, device)

    live = {}          # addr -> alloc id
    pre = []           # sizes of blocks that existed before recording
    body = []          # ("a", size) or ("f", ref); ref is ("t", id) or ("p", index)
    n_trace_allocs = 0
    for e in trace:
        act = e["action"]
        if act == "alloc":
            live[e["addr"]] = ("t", n_trace_allocs)
            body.append(("a", int(e["size"])))
            n_trace_allocs += 1
        elif act in frees:
            ref = live.pop(e["addr"], None)
            if ref is None:
                ref = ("p", len(pre))
                pre.append(int(e["size"]))
            body.append(("f", ref))
    seen_live = set(live)
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated" and addr not in seen_live:
                pre.append(int(b["size"]))
            addr += b["size"]

    sizes = sorted(set(pre) | {s for k, s in body if k == "a"})
    index = {s: i for i, s in enumerate(sizes)}
    events = [index[s] for s in pre]
    base = len(pre)
    for kind, v in body:
        if kind == "a":
            events.append(index[v])
        else:
            where, i = v
            events.append(-(i + 1) if where == "p" else -(base + i + 1))
    profile = {"format": FORMAT, "microBatch": micro_batch, "gradAccum": grad_accum,
               "sizes": sizes, "events": events}
    if source:
        profile["source"] = source
    return profile


def allocator_view(snapshot, device=0):
    """What PyTorch's caching allocator itself did, for comparison with the
    predictor's model of it: every segment of the device at the snapshot (its
    size, pool and blocks, each block as [size, state]) and the trace's
    segment events in order, each as [index of the tensor event it followed,
    action, size] (`segment_alloc`, `segment_free`, `oom`, ...). Segments only
    grow while a run trains without `empty_cache`, so the snapshot's segments
    are those of the reserved peak.
    """
    segments = []
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        segments.append({"size": int(seg["total_size"]),
                         "pool": seg.get("segment_type", ""),
                         "blocks": [[int(b["size"]), b.get("state", "")]
                                    for b in seg.get("blocks", [])]})
    trace, frees = device_trace(snapshot, device)
    tensor_events = 0
    seg_events = []
    for e in trace:
        act = e["action"]
        if act.startswith("segment_") or act in ("oom", "snapshot"):
            seg_events.append([tensor_events, act, int(e.get("size", 0))])
        elif act == "alloc" or act in frees:
            tensor_events += 1
    return {"segments": segments, "segmentEvents": seg_events}


NOISE = ("c10::", "std::", "torch::unwind", "torch::CapturedTraceback", "??", "_start",
         "__libc_start", "PyObject_", "_PyEval", "_PyObject", "PyEval_", "cfunction_", "method_vectorcall")


def alloc_origins(snapshot, device=0, min_bytes=1 << 20, frames=10):
    """Where the trace's allocations of at least `min_bytes` came from: each
    as [index of its tensor event, size, the innermost `frames` frame names
    that are not the allocator's or the interpreter's own]. Useful when the
    history was recorded with C++ stacks (`stacks="all"`), which name the
    ATen kernel that asked (a convolution's cuDNN workspace, an attention
    kernel's scratch)."""
    trace, frees = device_trace(snapshot, device)
    out = []
    tensor_events = 0
    for e in trace:
        act = e["action"]
        if act == "alloc":
            if int(e["size"]) >= min_bytes:
                names = [f.get("name", "")[:100] for f in e.get("frames") or []]
                names = [n for n in names if n and not n.startswith(NOISE)]
                out.append([tensor_events, int(e["size"]), names[:frames]])
            tensor_events += 1
        elif act in frees:
            tensor_events += 1
    return out


def convert_file(path, micro_batch, grad_accum=1, device=0, source=None, with_allocator=False,
                 with_origins=False):
    with open(path, "rb") as f:
        snap = pickle.load(f)
    prof = convert(snap, micro_batch, grad_accum, device, source)
    if with_allocator:
        prof["allocator"] = allocator_view(snap, device)
    if with_origins:
        prof["origins"] = alloc_origins(snap, device)
    return prof


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("snapshot")
    ap.add_argument("--micro-batch", type=int, required=True,
                    help="micro-batch the snapshot was recorded at")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args()
    prof = convert_file(args.snapshot, args.micro_batch, args.grad_accum, args.device,
                        source=args.snapshot)
    text = json.dumps(prof, separators=(",", ":"))
    if args.output == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
