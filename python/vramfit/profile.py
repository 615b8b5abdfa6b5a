"""Capture a training run's allocation profile on the CPU, without a GPU.

``python -m vramfit.profile --model MODULE:CALLABLE ... -o FILE`` builds the
model, runs a few training steps (the first creates the optimizer state, the
second is the steady state) under PyTorch's ``FakeTensorMode`` on the CPU, and
writes the ``vramfit.profile/v1`` file that ``vramfit predict --profile FILE``
replays through its caching-allocator model (docs/profile-format.md).

No memory is allocated for tensors: fake tensors carry shapes and dtypes only.
Every storage the run creates is recorded when it is created and when it is
freed (a weak reference on the storage), which is the sequence of requests
PyTorch's CUDA caching allocator would see. Where a CPU run would allocate
differently from a CUDA run, the capture does what CUDA does:

- parameters are created in the order ``model.to("cuda")`` moves them (the
  model is built on the meta device, so building costs nothing);
- autocast follows the CUDA policy: matrix products, convolutions and
  attention in the low precision (CPU autocast, which casts these the same
  way and caches the casts of weights the same way), and the ops CUDA runs in
  fp32 (layer_norm, group_norm, softmax, log_softmax, pow, exp, log, rsqrt,
  sum, the losses, ...) on fp32 copies;
- ``F.dropout`` is the fused kernel CUDA uses (a 1-byte mask), not the CPU's
  multiply by a noise tensor;
- ``F.scaled_dot_product_attention`` is a fused kernel (output and log-sum-exp
  kept for backward; no sequence x sequence matrix), as the flash and
  memory-efficient CUDA kernels are;
- optimizers use their ``foreach`` implementations, CUDA's default;
- the positions where cuBLAS's two workspaces (forward thread, autograd
  thread) are first needed are written as ``cublasWorkspaceAt``; the
  predictor allocates the GPU's workspace size there.

Not captured: cuDNN's convolution workspaces and the CUDA context (the
predictor's GPU profile covers the context).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

FORMAT = "vramfit.profile/v1"
PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "bf16", "fp16")
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adagrad")


class CaptureError(Exception):
    """Bad input to the capture (the message names the argument)."""


# --------------------------------------------------------------- the recorder


class _Recorder:
    """Storage creations and frees, in order: ``("a", bytes)`` and
    ``("f", allocation index)``."""

    def __init__(self) -> None:
        self.events: List[Tuple[str, int]] = []
        self.count = 0
        self.live = 0
        self.peak = 0
        self._ids: Dict[int, int] = {}
        self.workspace_at: List[int] = []
        self.in_backward = False
        self._ws_forward = False
        self._ws_backward = False

    def storage(self, st: Any) -> None:
        key = id(st)
        if key in self._ids:
            return
        nbytes = int(st.nbytes())
        index = self.count
        self.count += 1
        self._ids[key] = index
        self.events.append(("a", nbytes))
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key, index, nbytes)

    def _free(self, key: int, index: int, nbytes: int) -> None:
        self._ids.pop(key, None)
        self.events.append(("f", index))
        self.live -= nbytes

    def blas(self) -> None:
        """A cuBLAS call: the first in forward and in backward needs a workspace."""
        if self.in_backward and not self._ws_backward:
            self._ws_backward = True
            self.workspace_at.append(len(self.events))
        elif not self.in_backward and not self._ws_forward:
            self._ws_forward = True
            self.workspace_at.append(len(self.events))


def _dispatch_mode(rec: _Recorder) -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    aten = torch.ops.aten
    blas = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
            aten.addmv.default, aten.mv.default, aten.addbmm.default}

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in blas:
                rec.blas()
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    rec.storage(t.untyped_storage())
            return out

    return Recording()


# ------------------------------------------------------ CUDA behaviour on CPU


def _function_mode() -> Any:
    """Autocast's CUDA fp32 list, fused dropout and fused attention."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    T = torch.Tensor
    fp32_ops = {
        F.layer_norm, F.group_norm, torch.layer_norm, torch.group_norm,
        torch.pow, T.pow, T.__pow__, T.__rpow__, T.__rtruediv__,
        torch.exp, T.exp, torch.expm1, torch.log, T.log, torch.log2, torch.log10,
        torch.log1p, torch.reciprocal, T.reciprocal, torch.rsqrt, T.rsqrt,
        torch.acos, torch.asin, torch.cosh, torch.sinh, torch.tan, torch.erfinv,
        F.softplus, torch.norm, T.norm, F.normalize, F.cosine_similarity, torch.cdist,
        torch.dist, torch.renorm, torch.logsumexp, T.logsumexp,
        F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss,
        F.huber_loss, F.kl_div, F.binary_cross_entropy_with_logits,
        F.poisson_nll_loss, F.margin_ranking_loss, F.soft_margin_loss,
        F.multilabel_margin_loss, F.multi_margin_loss, F.hinge_embedding_loss,
        F.cosine_embedding_loss, F.triplet_margin_loss,
    }
    # Run in fp32 unless a dtype is given.
    fp32_opt_dtype = {F.softmax, F.log_softmax, F.softmin, torch.softmax, T.softmax,
                      torch.log_softmax, T.log_softmax, torch.sum, T.sum, torch.cumsum,
                      T.cumsum, torch.prod, T.prod, torch.cumprod, T.cumprod}
    low = (torch.float16, torch.bfloat16)

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in low:
            return x.float()
        if isinstance(x, (list, tuple)):
            return type(x)(up(v) for v in x)
        return x

    class FusedSdpa(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # type: ignore[no-untyped-def]
            # The flash and memory-efficient kernels write (batch, seq, heads,
            # dim) and return it transposed: `out.transpose(1, 2).contiguous()`
            # is then already contiguous and copies nothing.
            b, h, s = q.shape[:-1]
            out = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            q, k, v, out, lse = ctx.saved_tensors
            delta = lse.new_empty(lse.shape)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            del delta
            return dq, dk, dv

    class HalfToFloatSoftmax(torch.autograd.Function):
        """(log-)softmax of a bf16/fp16 input into fp32, as CUDA's kernels do
        it when asked for dtype=float32 (`half_to_float`): no upcast copy of
        the input, and the backward writes the gradient in the input's
        precision directly."""

        @staticmethod
        def forward(ctx, x, dim, log):  # type: ignore[no-untyped-def]
            out = x.new_empty(x.shape, dtype=torch.float32)
            ctx.save_for_backward(out)
            ctx.in_dtype = x.dtype
            return out

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            return grad.new_empty(grad.shape, dtype=ctx.in_dtype), None, None

    softmaxes = {F.softmax: False, torch.softmax: False, T.softmax: False,
                 F.log_softmax: True, torch.log_softmax: True, T.log_softmax: True}

    def half_to_float(func: Any, args: Any, kwargs: Any, autocast: bool) -> Any:
        """The fused (log-)softmax for a low-precision input asked for (or,
        under autocast, given) fp32; None when the call is something else."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dtype not in low:
            return None
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        dtype = kwargs.get("dtype")
        if not isinstance(dim, int) or len(args) > 2:
            return None
        if dtype is torch.float32 or (autocast and dtype is None):
            return HalfToFloatSoftmax.apply(x, dim, softmaxes[func])
        return None

    class CudaBehaviour(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            autocast = torch.is_autocast_enabled("cpu")
            if func is F.scaled_dot_product_attention:
                q, k, v = args[:3]
                if autocast:
                    dt = torch.get_autocast_dtype("cpu")
                    q, k, v = q.to(dt), k.to(dt), v.to(dt)
                if q.dtype == torch.float32 and k.shape[-3] != q.shape[-3]:
                    # fp32 with grouped-query heads: no fused CUDA kernel runs
                    # it, PyTorch takes the math path (scores materialised).
                    kw = {n: kwargs[n] for n in ("attn_mask", "dropout_p", "is_causal", "scale")
                          if n in kwargs}
                    return torch.ops.aten._scaled_dot_product_attention_math(
                        q, k, v, enable_gqa=True, **kw)[0]
                return FusedSdpa.apply(q, k, v)
            if func is F.dropout:
                x = args[0]
                p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                training = kwargs.get("training", args[2] if len(args) > 2 else True)
                inplace = kwargs.get("inplace", args[3] if len(args) > 3 else False)
                if training and 0 < p < 1 and not inplace and x.numel() > 0:
                    return torch.native_dropout(x, p, True)[0]
            if func in softmaxes:
                fused = half_to_float(func, args, kwargs, autocast)
                if fused is not None:
                    return fused
            if (autocast and func is F.cross_entropy and args and isinstance(args[0], torch.Tensor)
                    and args[0].dtype in low and args[0].dim() == 2
                    and not kwargs.get("label_smoothing")):
                # cross_entropy is log_softmax (fp32 by autocast, fused as
                # above) and nll_loss on its fp32 output
                lsm = HalfToFloatSoftmax.apply(args[0], 1, True)
                kw = {n: kwargs[n] for n in ("weight", "ignore_index", "reduction") if n in kwargs}
                return F.nll_loss(lsm, args[1] if len(args) > 1 else kwargs["target"], **kw)
            if autocast and func in fp32_ops:
                args, kwargs = up(args), {k: up(v) for k, v in kwargs.items()}
            elif autocast and func in fp32_opt_dtype and kwargs.get("dtype") is None:
                if args and isinstance(args[0], torch.Tensor) and args[0].dtype in low:
                    try:
                        return func(*args, **dict(kwargs, dtype=torch.float32))
                    except TypeError:  # a dtype given by position
                        pass
            return func(*args, **kwargs)

    return CudaBehaviour()


class _Scaler:
    """GradScaler's tensors and in-place kernels, without its data-dependent
    check (``found_inf.item()``), which fake tensors cannot answer: the step
    is always taken."""

    def __init__(self) -> None:
        import torch

        self.scale_t = torch.full((), 65536.0)
        self.growth = torch.full((), 0, dtype=torch.int32)

    def scale(self, loss: Any) -> Any:
        return loss * self.scale_t

    def step(self, opt: Any) -> None:
        import torch

        inv = self.scale_t.double().reciprocal().float()
        found = torch.full((), 0.0)
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        opt.step()
        self.found = found

    def update(self) -> None:
        import torch

        torch._amp_update_scale_(self.scale_t, self.growth, self.found, 2.0, 0.5, 2000)


# ------------------------------------------------------------------ the models


def _load_callable(spec: str) -> Callable[..., Any]:
    if ":" not in spec:
        raise CaptureError(f"--model must be MODULE:CALLABLE, got '{spec}'")
    mod_name, attr = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise CaptureError(f"--model: cannot import module '{mod_name}': {e}") from e
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CaptureError(f"--model: module '{mod_name}' has no '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CaptureError(f"--model: '{spec}' is not callable")
    return obj  # type: ignore[no-any-return]


def read_config(text: Optional[str]) -> Dict[str, Any]:
    """``--config``: inline JSON (starting with ``{``) or a path to a JSON file."""
    if text is None:
        return {}
    try:
        if text.lstrip().startswith("{"):
            cfg = json.loads(text)
        else:
            with open(text) as f:
                cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise CaptureError(f"--config: {e}") from e
    if not isinstance(cfg, dict):
        raise CaptureError("--config must be a JSON object")
    return cfg


def is_transformers(spec: str) -> bool:
    return spec.split(":", 1)[0].split(".")[0] == "transformers"


def build_on_meta(spec: str, config: Dict[str, Any], attention: Optional[str]) -> Any:
    """The model, built on the meta device (no memory, no initialisation cost)."""
    import torch

    fn = _load_callable(spec)
    with torch.device("meta"):
        if is_transformers(spec):
            cfg_cls = getattr(fn, "config_class", None)
            if cfg_cls is None:
                raise CaptureError(f"--model: '{spec}' is not a transformers model class")
            cfg = cfg_cls.from_dict(dict(config))
            if attention:
                cfg._attn_implementation = attention
            if hasattr(fn, "_from_config"):
                try:
                    model = fn._from_config(cfg, attn_implementation=attention) if attention \
                        else fn._from_config(cfg)
                except TypeError:
                    model = fn._from_config(cfg)
            else:
                model = fn(cfg)
        else:
            model = fn(**config)
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"--model: '{spec}' returned {type(model).__name__}, not an nn.Module")
    return model


def materialize(model: Any, dtype: Any) -> None:
    """Gives every meta parameter and buffer fake storage, in the order
    ``model.to(device, dtype)`` converts them (children first), tied tensors
    once."""
    import torch

    done: Dict[int, Any] = {}  # id of the meta tensor (alive throughout) -> its replacement

    def conv(t: Any) -> Any:
        kw = {"device": "cpu"}
        if dtype is not None and t.is_floating_point():
            kw["dtype"] = dtype
        return torch.empty_like(t, **kw)

    def walk(m: Any) -> None:
        for child in m.children():
            walk(child)
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                done[id(p)] = (torch.nn.Parameter(conv(p), requires_grad=p.requires_grad), p)
            m._parameters[name] = done[id(p)][0]
        for name, b in list(m._buffers.items()):
            if b is None:
                continue
            if id(b) not in done:
                done[id(b)] = (conv(b), b)
            m._buffers[name] = done[id(b)][0]

    walk(model)


# -------------------------------------------------------------------- capture


def make_optimizer(name: str, params: Any) -> Any:
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=1e-2, foreach=True)
    raise CaptureError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got '{name}'")


def parse_input(text: str) -> Tuple[int, ...]:
    """``3x224x224`` -> (3, 224, 224)."""
    try:
        dims = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise CaptureError(f"--input must look like 3x224x224, got '{text}'")
    return dims


def capture(model_spec: str, config: Dict[str, Any], batch: int, precision: str,
            optimizer: str, input_shape: Optional[Sequence[int]] = None,
            seq_len: Optional[int] = None, steps: int = 2, grad_accum: int = 1,
            checkpointing: bool = False, attention: Optional[str] = None,
            num_classes: Optional[int] = None,
            zero_grad: Optional[str] = None) -> Dict[str, Any]:
    """Runs the capture and returns the profile as a dict."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    if precision not in PRECISIONS:
        raise CaptureError(f"--precision must be one of {', '.join(PRECISIONS)}, got '{precision}'")
    if optimizer not in OPTIMIZERS:
        raise CaptureError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got '{optimizer}'")
    if batch < 1 or steps < 1 or grad_accum < 1:
        raise CaptureError("--batch, --steps and --grad-accum must be at least 1")
    hf = is_transformers(model_spec)
    if hf and not seq_len:
        raise CaptureError("--seq-len is needed for a transformers model")
    if not hf and not input_shape:
        raise CaptureError("--input (e.g. 3x224x224) is needed for a model that is not from transformers")
    zero_grad = zero_grad or ("after-step" if hf else "before-backward")
    if zero_grad not in ("after-step", "before-backward"):
        raise CaptureError("--zero-grad must be after-step or before-backward")
    pure = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    amp = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision)

    t0 = time.time()
    model = build_on_meta(model_spec, config, attention)
    rec = _Recorder()
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake, _dispatch_mode(rec), _function_mode():
        materialize(model, pure)
        if hf and hasattr(model, "tie_weights"):
            model.tie_weights()  # ties are kept by materialize; this re-ties if the class unties
        if checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise CaptureError("--checkpointing needs a model with gradient_checkpointing_enable()")
            # The library's default (non-reentrant) checkpointing; the
            # recomputation in backward runs outside the modes of the
            # forward, so it gets its own CUDA-behaviour mode.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False,
                "context_fn": lambda: (contextlib.nullcontext(), _function_mode())})
        model.train()
        opt = make_optimizer(optimizer, model.parameters())
        scaler = _Scaler() if precision == "amp-fp16" else None
        if hf:
            vocab = int(getattr(model.config, "vocab_size", 0) or 0)
            if vocab <= 0:
                raise CaptureError("the transformers config has no vocab_size")
            encoder = getattr(model.config, "model_type", "") == "bert" or \
                type(model).__name__.endswith("ForMaskedLM")

            def make_batch() -> Dict[str, Any]:
                ids = torch.randint(0, vocab, (batch, int(seq_len or 0)))
                b = {"input_ids": ids, "labels": ids.clone()}
                if encoder and getattr(model.config, "type_vocab_size", 0):
                    b["token_type_ids"] = torch.zeros(batch, int(seq_len or 0), dtype=torch.long)
                return b

            def forward(b: Dict[str, Any]) -> Tuple[Any, Any]:
                out = model(**b)
                return out.loss, out
        else:
            classes = num_classes or int(config.get("num_classes", 1000))
            shape = tuple(input_shape or ())

            def make_batch() -> Dict[str, Any]:
                x = torch.randn((batch,) + shape)
                if pure is not None:
                    x = x.to(pure)
                return {"x": x, "y": torch.randint(0, classes, (batch,))}

            def forward(b: Dict[str, Any]) -> Tuple[Any, Any]:
                out = model(b["x"])
                if hasattr(out, "logits"):
                    out = out.logits
                if out.dim() == 2:
                    return F.cross_entropy(out, b["y"]), out
                return out.float().pow(2).mean(), out

        outputs = loss = None
        for _step in range(steps):
            for micro in range(grad_accum):
                b = make_batch()
                with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                    loss, outputs = forward(b)
                if grad_accum > 1:
                    loss = loss / grad_accum
                if zero_grad == "before-backward" and micro == 0:
                    opt.zero_grad()
                rec.in_backward = True
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                rec.in_backward = False
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if zero_grad == "after-step":
                opt.zero_grad()
        del outputs, loss, b
    seconds = time.time() - t0
    return to_profile(rec, batch, grad_accum, {
        "tool": "vramfit.profile", "mode": "fake-cpu", "torch": torch.__version__,
        "model": model_spec, "precision": precision, "optimizer": optimizer,
        "steps": steps, "checkpointing": checkpointing, "attention": attention,
        "zeroGrad": zero_grad, "seconds": round(seconds, 3),
        "input": list(input_shape) if input_shape else None, "seqLen": seq_len,
    })


def to_profile(rec: _Recorder, micro_batch: int, grad_accum: int,
               capture_info: Dict[str, Any]) -> Dict[str, Any]:
    """The recorded events in the vramfit.profile/v1 form."""
    sizes = sorted({v for k, v in rec.events if k == "a"})
    index = {s: i for i, s in enumerate(sizes)}
    events = [index[v] if k == "a" else -(v + 1) for k, v in rec.events]
    return {"format": FORMAT, "microBatch": micro_batch, "gradAccum": grad_accum,
            "sizes": sizes, "events": events, "cublasWorkspaceAt": rec.workspace_at,
            "source": f"vramfit.profile {capture_info['model']}",
            "capture": dict(capture_info, peakLiveBytes=rec.peak, allocations=rec.count)}


# ------------------------------------------------------------------------ CLI


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vramfit.profile",
        description="Capture a training run's allocation profile on the CPU (no GPU).")
    ap.add_argument("--model", required=True,
                    help="MODULE:CALLABLE, e.g. torchvision.models:resnet50 or "
                         "transformers:GPT2LMHeadModel")
    ap.add_argument("--config", help="JSON object or file: the transformers config, or "
                                     "keyword arguments of the callable")
    shape = ap.add_mutually_exclusive_group(required=True)
    shape.add_argument("--input", help="per-sample input shape, e.g. 3x224x224")
    shape.add_argument("--seq-len", type=int, help="tokens per sample (transformers)")
    ap.add_argument("--batch", type=int, required=True, help="micro-batch per GPU")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS)
    ap.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--checkpointing", action="store_true",
                    help="the library's gradient_checkpointing_enable()")
    ap.add_argument("--attention", choices=("sdpa", "eager"),
                    help="transformers attn_implementation")
    ap.add_argument("--num-classes", type=int, help="targets for the cross-entropy")
    ap.add_argument("--zero-grad", choices=("after-step", "before-backward"),
                    help="where gradients are cleared (default: after the step for "
                         "transformers, before backward otherwise, as their docs do)")
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args(argv)
    try:
        shape_in = parse_input(args.input) if args.input else None
        prof = capture(args.model, read_config(args.config), args.batch, args.precision,
                       args.optimizer, input_shape=shape_in, seq_len=args.seq_len,
                       steps=args.steps, grad_accum=args.grad_accum,
                       checkpointing=args.checkpointing, attention=args.attention,
                       num_classes=args.num_classes, zero_grad=args.zero_grad)
    except CaptureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(prof, separators=(",", ":"))
    if args.output == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.output, "w") as f:
            f.write(text)
    c = prof["capture"]
    print(f"captured {c['allocations']} allocations, {len(prof['events'])} events, "
          f"live peak {c['peakLiveBytes'] / 2**30:.3f} GiB in {c['seconds']:.1f}s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
