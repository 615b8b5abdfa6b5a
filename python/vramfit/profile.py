"""Capture a training run's allocation profile on the CPU, without a GPU.

``python -m vramfit.profile --model MODULE:CALLABLE ... -o FILE`` builds the
model, runs ``STEPS`` training steps (the first creates the optimizer state,
the later ones are the steady state) under PyTorch's ``FakeTensorMode`` on the CPU, and
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
- ``F.cross_entropy`` of low-precision logits is CUDA's composite under
  autocast: log-probabilities in the logits' dtype, then an fp32 copy of
  them for ``nll_loss`` (both kept for backward), not one fp32 block;
- ``F.dropout`` is the fused kernel CUDA uses (a 1-byte mask), not the CPU's
  multiply by a noise tensor;
- ``F.scaled_dot_product_attention`` runs the kernel CUDA would pick
  (cuDNN, flash, memory-efficient or the math fallback; ``_sdpa_backend``):
  a fused kernel keeps its output and log-sum-exp, no sequence x sequence
  matrix, and the memory-efficient one writes a mask's gradient; the math
  fallback materialises the scores in fp32, as CUDA's does for bf16/fp16;
- ``torch._grouped_mm`` (MoE experts) runs in fp32 as CUDA's kernel does;
- ``F.rms_norm`` (``torch.nn.RMSNorm``) is CUDA's fused kernel: the output
  and an fp32 inverse RMS per row, no fp32 copy of a low-precision input;
- optimizers use their ``foreach`` implementations, CUDA's default (an
  optimizer the script made with ``foreach`` unset decides as it would for
  parameters on a GPU);
- a function checkpointed with ``torch.utils.checkpoint`` (reentrant or
  not) is recomputed in backward under the same rules, although autograd's
  engine runs it outside the forward's torch-function modes;
- the positions where cuBLAS's two workspaces (forward thread, autograd
  thread) are first needed are written as ``cublasWorkspaceAt`` (before the
  call's output); the predictor allocates the GPU's workspace size right
  after that output, where cuBLAS takes it;
- autograd's accumulation of two gradients of one tensor (a tied word table,
  the residual stream's two branches) adds the second into the first, as
  CUDA's engine does for plain tensors; for fake tensors (a tensor subclass)
  the engine makes a new sum, which the capture turns back into the first
  gradient (``_accumulate_in_place``);
- CUDA's softmax backward multiplies the gradient by the output into a
  temporary first, and the math attention's ``_safe_softmax`` finds fully
  masked rows through a boolean of the scores' shape: each is taken and given
  back inside its call (``transient``);
- a value the step reads from a tensor (``.item()``, ``bool()``), which fake
  tensors do not have, is the usual one: ``False``, 0.0 or 1.

- every convolution call is written to ``convolutions`` with its shape,
  where cuDNN would take its workspace (after the forward's output, and in
  backward after each gradient); the predictor sizes the workspaces for
  the GPU (src/predict/conv.rs).

- every sum of contiguous rows to a vector (a bias's gradient summed over
  the tokens) is written to ``reductions`` with its rows and outputs, where
  ATen's reduction kernel takes its staging buffer; the predictor sizes it
  for the GPU (src/predict/reduce.rs).

Not captured: the CUDA context (the predictor's GPU profile covers it).

``capture_step(model, step_fn, micro_batch=...)`` captures a script's own
training step, and under ``VRAMFIT_PHASE=profile`` ``vramfit.Step`` and the
adapters capture the real step and exit (docs/profile-format.md).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import importlib
import json
import math
import os
import sys
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

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
        self.convolutions: List[Dict[str, Any]] = []
        self.reductions: List[Dict[str, int]] = []
        self.data_reads = 0
        # allocation indices of sums made in backward (``aten.add``): the
        # candidates for autograd's gradient accumulation, which CUDA does
        # in place (see ``_accumulate_in_place``)
        self.backward_sums: set = set()
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

    def transient(self, nbytes: int) -> None:
        """A buffer a CUDA kernel takes and gives back inside its call, which
        the CPU kernel does not have."""
        index = self.count
        self.count += 1
        self.events.append(("a", nbytes))
        self.peak = max(self.peak, self.live + nbytes)
        self.events.append(("f", index))

    def backward_sum(self, out: Any, first: Any) -> None:
        """``out`` is a sum made while autograd runs backward, ``first`` its
        first operand (the gradient autograd's input buffer held). A view
        shares its storage with its base, which it keeps alive, so the
        engine does not add into it: a tied head's gradient, the transposed
        view of its matrix product where the weight is not cast, is summed
        into a new tensor on CUDA (the H200's recorded fp32 and bf16 runs of
        GPT-2, Gemma, Qwen2, LLaMA 3.2; their autocast runs add in place)."""
        if first._is_view():
            return
        index = self._ids.get(id(out.untyped_storage()))
        if index is not None:
            self.backward_sums.add(index)

    def blas(self, in_backward: bool) -> None:
        """A cuBLAS call: the first in forward and in backward needs a workspace."""
        if in_backward and not self._ws_backward:
            self._ws_backward = True
            self.workspace_at.append(len(self.events))
        elif not in_backward and not self._ws_forward:
            self._ws_forward = True
            self.workspace_at.append(len(self.events))

    def column_sum(self, x: Any, dims: Any) -> None:
        """A sum of contiguous rows to a vector (``_column_sum``), recorded
        after its output, where ATen's reduction kernel takes its staging
        buffer (the predictor sizes it for the GPU: src/predict/reduce.rs)."""
        shape = _column_sum(x, dims)
        if shape is not None:
            self.reductions.append({"at": len(self.events), "rows": shape[0],
                                    "outputs": shape[1]})

    def convolution(self, kind: str, x: Any, weight: Any, args: Sequence[Any]) -> None:
        """A convolution call that CUDA runs with a cuDNN workspace: ``kind``
        is ``forward``, ``input`` (the input's gradient) or ``weight`` (the
        weight's), recorded after the call's output, where cuDNN takes the
        workspace (the predictor sizes it for the GPU: src/predict/conv.rs).
        ``args`` are the convolution's stride, padding, dilation, transposed
        flag, output padding and groups."""
        stride, padding, dilation, transposed, _output_padding, groups = args
        self.convolutions.append({
            "at": len(self.events), "kind": kind, "input": list(x.shape),
            "weight": list(weight.shape), "stride": list(stride), "padding": list(padding),
            "dilation": list(dilation), "groups": int(groups), "transposed": bool(transposed),
            "dtype": str(x.dtype).replace("torch.", ""),
            # ATen gives a depthwise convolution of a channels-last input to
            # cuDNN, a contiguous one to its own kernel
            "channelsLast": _channels_last(x)})


def _column_sum(x: Any, dims: Any) -> Optional[Tuple[int, int]]:
    """(rows, outputs) when summing ``x`` over ``dims`` adds up contiguous
    rows: ``dims`` are its leading dimensions, the rest are kept, and ``x``
    is contiguous (a bias's gradient summed over the tokens). Other sums
    take no staging buffer that the predictor models."""
    if x.dim() < 2 or not x.is_contiguous():
        return None
    wanted = sorted({int(d) % x.dim() for d in (dims if isinstance(dims, (list, tuple)) else [dims])})
    if not wanted or wanted != list(range(len(wanted))) or len(wanted) == x.dim():
        return None
    rows = math.prod(int(n) for n in x.shape[:len(wanted)])
    outputs = math.prod(int(n) for n in x.shape[len(wanted):])
    return rows, outputs


def _channels_last(x: Any) -> bool:
    import torch

    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last)


def _in_backward() -> bool:
    """True while the autograd engine runs a backward pass (CUDA runs it on
    its own thread, which has its own cuBLAS workspace)."""
    import torch

    return bool(torch._C._current_graph_task_id() != -1)


def _dispatch_mode(rec: _Recorder) -> Any:
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    aten = torch.ops.aten
    blas = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
            aten.addmv.default, aten.mv.default, aten.addbmm.default}

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in blas:
                rec.blas(_in_backward())
            if func is aten._local_scalar_dense.default:
                try:
                    return func(*args, **(kwargs or {}))
                except DataDependentOutputException:
                    return _unknown_value(rec, args[0])
            out = func(*args, **(kwargs or {}))
            if func is aten.convolution.default and len(args) >= 9:
                record(out)
                rec.convolution("forward", args[0], args[1], args[3:9])
            elif func is aten.convolution_backward.default and len(args) >= 10:
                # ATen's order: the input's gradient and its workspace, then
                # the weight's and its workspace, then the bias's
                grad_input, grad_weight, grad_bias = out
                x, weight = args[1], args[2]
                for kind, t in (("input", grad_input), ("weight", grad_weight)):
                    if t is not None:
                        record(t)
                        rec.convolution(kind, x, weight, args[4:10])
                record(grad_bias)
            elif func is aten.sum.dim_IntList and len(args) >= 2:
                record(out)
                rec.column_sum(args[0], args[1])
            elif func is aten._softmax_backward_data.default:
                # CUDA's kernel multiplies the gradient by the output into a
                # temporary first (the H200's recorded runs: the scores'
                # gradient, then a buffer of its size taken and given back)
                record(out)
                rec.transient(args[0].numel() * args[0].element_size())
            elif func is aten._safe_softmax.default:
                # CUDA's softmax that zeroes fully masked rows finds them
                # through a boolean of the input's shape (the math attention's)
                record(out)
                rec.transient(args[0].numel())
            else:
                record(out)
                # (a checkpoint's recomputation runs in backward too, under
                # grad mode: its sums are the forward's, made anew)
                if (func is aten.add.Tensor and isinstance(out, FakeTensor) and _in_backward()
                        and not torch.is_grad_enabled()):
                    rec.backward_sum(out, args[0])
            return out

    def record(out: Any) -> None:
        for t in tree_flatten(out)[0]:
            # real tensors (a sampler's indices, made outside the fake
            # mode) are host memory
            if isinstance(t, FakeTensor) and t.device.type != "meta":
                rec.storage(t.untyped_storage())

    return Recording()


def _unknown_value(rec: _Recorder, t: Any) -> Any:
    """The answer to ``.item()`` / ``bool()`` of a tensor whose value fake
    tensors do not have: the usual value of a training step's checks, so
    that the step takes its normal, full path. ``False`` for a flag (no
    LayerDrop skip, no NaN found), 0.0 for a float (GradScaler's found-inf
    is zero, so the optimizer steps; a logged loss), 1 for an integer (a
    count that may divide)."""
    import torch

    rec.data_reads += 1
    if t.dtype == torch.bool:
        return False
    if t.is_floating_point() or t.is_complex():
        return 0.0
    return 1


# Optimizer steps a capture records: the first creates the optimizer's state,
# the second is the steady state, and the H200's runs show the caching
# allocator can still take a new segment in the third (a step's logits no
# longer fitting the blocks the second left), so three.
STEPS = 3

# Libraries whose versions a profile records when the captured step imported them.
MODELLING_LIBRARIES = ("transformers", "torchvision", "timm", "diffusers", "peft", "accelerate",
                       "lightning", "pytorch_lightning")


# ------------------------------------------------------ CUDA behaviour on CPU


def _sdpa_backend(q: Any, k: Any, v: Any, mask: Any, causal: bool) -> str:
    """The kernel ``F.scaled_dot_product_attention`` takes on a CUDA GPU of
    compute capability 8.0 to 9.0 (PyTorch's ``select_sdp_backend``: cuDNN,
    then flash, then memory-efficient, then the math fallback), for the
    constraints that decide it in practice: dtypes, head dimensions, the
    attention mask (none for flash, none that needs a gradient for cuDNN)
    and every input's last dimension being contiguous (stride 1)."""
    import torch

    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "math"
    if any(t.stride(-1) != 1 and t.size(-1) != 1 for t in (q, k, v)):
        return "math"
    low = q.dtype in (torch.float16, torch.bfloat16)
    d, dv = q.size(-1), v.size(-1)
    grouped = k.size(-3) != q.size(-3)
    mask_contiguous = mask is None or mask.stride(-1) == 1 or mask.size(-1) == 1
    mask_grad = mask is not None and mask.requires_grad
    square = q.size(-2) == k.size(-2)
    if (low and mask_contiguous and not mask_grad and d == dv == k.size(-1) and d % 8 == 0
            and d <= 128 and k.size(-2) > 1 and (square or not causal) and not grouped):
        return "cudnn"
    if low and mask is None and d == dv == k.size(-1) and d <= 256 and (square or not causal):
        return "flash"
    align = 8 if low else 4
    if (mask_contiguous and not grouped and d == k.size(-1) and d % align == 0
            and dv % align == 0):
        return "efficient"
    return "math"


def _function_mode() -> Any:
    """Autocast's CUDA fp32 list, fused dropout, attention as CUDA runs it,
    grouped matrix products, and tensors kept on the CPU."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import unset_fake_temporarily
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
    # CPU autocast casts these ops' inputs to the widest dtype first (a copy
    # of each narrower input); CUDA autocast leaves them alone and the CUDA
    # kernel promotes as it writes (PyTorch's autocast op reference: "CPU
    # Ops that promote to the widest input type"). A fp32 cache grown by a
    # bf16 value, as transformers' DynamicLayer does, then has no copy.
    cpu_promote = {torch.cat, torch.concat, torch.concatenate, torch.stack,
                   torch.index_copy, T.index_copy}
    low = (torch.float16, torch.bfloat16)
    grouped_mms = {f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None))
                   if f is not None}

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in low:
            return x.float()
        if isinstance(x, (list, tuple)):
            return type(x)(up(v) for v in x)
        return x

    class FusedSdpa(torch.autograd.Function):
        """A fused CUDA attention kernel (cuDNN, flash or memory-efficient):
        output and log-sum-exp kept for backward, no sequence x sequence
        matrix. With a mask, the mask is kept too; the memory-efficient
        kernel computes the mask's gradient when it needs one, at the full
        (batch, heads, queries, keys) shape, keys padded to 16."""

        @staticmethod
        def forward(ctx, q, k, v, mask, bias_grad):  # type: ignore[no-untyped-def]
            # The kernels write (batch, seq, heads, dim) and return it
            # transposed: `out.transpose(1, 2).contiguous()` is then already
            # contiguous and copies nothing.
            b, h, s = q.shape[:-1]
            out = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse, mask)
            ctx.bias_grad = bias_grad
            return out

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            q, k, v, out, lse, mask = ctx.saved_tensors
            low = q.dtype in (torch.float16, torch.bfloat16)
            delta = None if low else lse.new_empty(lse.shape)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            if low:
                # The half-precision kernels' backward takes one buffer after
                # the gradients: the queries' gradient accumulated in fp32
                # and the softmax's row sums, and with grouped heads the keys'
                # and values' gradients at every query head before they are
                # summed (the H200's recorded GPT-2, LLaMA and Mistral runs,
                # to 512 bytes)
                b, h, sq, d = q.shape
                nbytes = b * h * sq * (d + 1) * 4
                if k.shape[-3] != h:
                    nbytes += b * h * k.shape[-2] * (d + v.shape[-1]) * q.element_size()
                workspace = q.new_empty((nbytes,), dtype=torch.uint8)
                del workspace
            dmask = None
            if ctx.bias_grad:
                keys = k.shape[-2]
                full = q.new_empty(tuple(q.shape[:-1]) + (-(-keys // 16) * 16,))
                dmask = full[..., :keys].sum_to_size(mask.shape)
                del full
            del delta
            return dq, dk, dv, dmask, None

    def math_sdpa(q: Any, k: Any, v: Any, mask: Any, p: float, causal: bool, scale: Any,
                  gqa: bool) -> Any:
        """PyTorch's math fallback as it runs on CUDA: bf16/fp16 inputs
        upcast to fp32 (unless math-SDP reduced precision is allowed), the
        scores, softmax and dropout (fused: a 1-byte mask) materialised."""
        with torch.autocast("cpu", enabled=False):
            dtype = q.dtype
            if dtype in low and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
                q, k, v = q.float(), k.float(), v.float()
            factor = math.sqrt(abs(scale) if scale is not None else 1.0 / math.sqrt(q.size(-1)))
            q = q * factor
            if causal:
                keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
                mask = torch.where(keep, torch.zeros((), dtype=q.dtype),
                                   torch.full((), float("-inf"), dtype=q.dtype))
            if gqa and k.size(-3) != q.size(-3):
                k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
                v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
            attn = torch.matmul(q, k.transpose(-2, -1) * factor)
            if mask is not None:
                attn.add_(mask)
            attn = torch.ops.aten._safe_softmax.default(attn, -1)
            if p > 0:
                attn = torch.native_dropout(attn, p, True)[0]
            return torch.matmul(attn, v).to(dtype)

    def sdpa(args: Any, kwargs: Any, autocast: bool) -> Any:
        q, k, v = args[:3]
        params = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale"), args[3:]))
        params.update(kwargs)
        mask = params.get("attn_mask")
        p = float(params.get("dropout_p") or 0.0)
        causal = bool(params.get("is_causal") or False)
        if autocast:
            # CUDA autocast casts every floating-point input, the mask too,
            # last argument first (its wrapper's arguments are evaluated
            # right to left: the H200's recorded Mistral autocast runs cast
            # the keys and values before the queries)
            dt = torch.get_autocast_dtype("cpu")
            if mask is not None and mask.is_floating_point():
                mask = mask.to(dt)
            v = v.to(dt)
            k = k.to(dt)
            q = q.to(dt)
        if mask is not None and mask.dtype == torch.bool:
            # made additive in the query's dtype before a kernel is chosen
            mask = torch.where(mask, torch.zeros((), dtype=q.dtype),
                               torch.full((), float("-inf"), dtype=q.dtype))
        backend = _sdpa_backend(q, k, v, mask, causal)
        if backend == "math":
            return math_sdpa(q, k, v, mask, p, causal, params.get("scale"),
                             bool(params.get("enable_gqa") or False))
        return FusedSdpa.apply(q, k, v, mask,
                               backend == "efficient" and mask is not None and mask.requires_grad)

    class GroupedMm(torch.autograd.Function):
        """``torch._grouped_mm`` / ``F.grouped_mm`` as CUDA runs them for any
        of fp32, bf16 and fp16 (older PyTorch's fake kernel takes bf16 only,
        while CUDA's runs fp32 too, which is what MoE layers under autocast
        pass): the output, its rows padded to 16 bytes as CUDA pads them;
        the gradients are the inputs' shapes."""

        @staticmethod
        def forward(ctx, a, b, offs, out_dtype):  # type: ignore[no-untyped-def]
            ctx.save_for_backward(a, b, offs)
            if a.dim() == 2 and b.dim() == 2:
                size = [offs.size(0), a.size(0), b.size(1)]
            elif a.dim() == 2:
                size = [a.size(0), b.size(-1)]
            elif b.dim() == 2:
                size = [a.size(1), b.size(1)]
            else:
                size = [a.size(0), a.size(1), b.size(-1)]
            dtype = out_dtype or a.dtype
            align = max(1, 16 // dtype.itemsize)
            row = -(-size[-1] // align) * align
            stride = [size[1] * row, row, 1] if len(size) == 3 else [row, 1]
            return torch.empty_strided(size, stride, dtype=dtype)

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            a, b, _ = ctx.saved_tensors
            da = torch.empty_like(a) if ctx.needs_input_grad[0] else None
            db = torch.empty_like(b) if ctx.needs_input_grad[1] else None
            return da, db, None, None

    def grouped_mm(args: Any, kwargs: Any) -> Any:
        names = ("mat_a", "mat_b", "offs", "bias", "out_dtype")
        params = dict(zip(names, args))
        params.update(kwargs)
        if params.get("bias") is not None:
            raise CaptureError("grouped_mm with a bias is not supported by the capture")
        return GroupedMm.apply(params["mat_a"], params["mat_b"], params.get("offs"),
                               params.get("out_dtype"))

    rms_norms = {f for f in (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))
                 if f is not None}

    class FusedRmsNorm(torch.autograd.Function):
        """``F.rms_norm`` as CUDA runs it (one fused kernel, ATen's
        ``_fused_rms_norm``): the output and one fp32 inverse RMS per row,
        the input kept as it is; the backward writes the input's and the
        weight's gradients. The CPU's composite path keeps an fp32 copy of a
        low-precision input instead."""

        @staticmethod
        def forward(ctx, x, weight, dims):  # type: ignore[no-untyped-def]
            dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
            out = torch.empty_like(x, dtype=dtype)
            rows = tuple(x.shape[:x.dim() - dims]) + (1,) * dims
            rstd = x.new_empty(rows, dtype=torch.float32)
            ctx.save_for_backward(x, weight, rstd)
            return out

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            x, weight, _ = ctx.saved_tensors
            dx = torch.empty_like(x) if ctx.needs_input_grad[0] else None
            dw = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
            return dx, dw, None

    def rms_norm(args: Any, kwargs: Any, autocast: bool) -> Any:
        params = dict(zip(("input", "normalized_shape", "weight", "eps"), args))
        params.update(kwargs)
        x, weight = params["input"], params.get("weight")
        shape = params["normalized_shape"]
        dims = 1 if isinstance(shape, int) else len(shape)
        if autocast:
            # on autocast's fp32 list, as layer_norm
            x, weight = up(x), up(weight)
        return FusedRmsNorm.apply(x, weight, dims)

    class HalfToFloatSoftmax(torch.autograd.Function):
        """(log-)softmax of an fp16 input into fp32, as CUDA's kernels do it
        when asked for dtype=float32 (`half_to_float`): no upcast copy of the
        input, and the backward writes the gradient in the input's precision
        directly. ATen takes that path for Half only: a bf16 input is
        converted to fp32 first (``input.toType``), on CUDA as on the CPU,
        so bf16 takes the CPU's own path."""

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
        """The fused (log-)softmax for an fp16 input asked for (or, under
        autocast, given) fp32; None when the call is something else."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dtype is not torch.float16:
            return None
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        dtype = kwargs.get("dtype")
        if not isinstance(dim, int) or len(args) > 2:
            return None
        if dtype is torch.float32 or (autocast and dtype is None):
            return HalfToFloatSoftmax.apply(x, dim, softmaxes[func])
        return None

    ce_names = ("input", "target", "weight", "size_average", "ignore_index", "reduce",
                "reduction", "label_smoothing")

    def cross_entropy(args: Any, kwargs: Any) -> Any:
        """``F.cross_entropy`` of low-precision logits under CUDA autocast,
        which has no rule for it: its composite calls ``log_softmax`` with
        the input's own dtype (autocast keeps an explicit dtype, so the
        log-probabilities stay bf16/fp16, kept for backward), then
        ``nll_loss``, on autocast's fp32 list, which takes an fp32 copy of
        them (kept for backward too). None for what the composite does
        otherwise (probability targets, label smoothing): the fp32 list's
        upcast then stands."""
        params = dict(zip(ce_names, args))
        params.update(kwargs)
        x, target = params.get("input"), params.get("target")
        if not isinstance(x, torch.Tensor) or x.dtype not in low or x.dim() < 1:
            return None
        if not isinstance(target, torch.Tensor) or target.is_floating_point():
            return None
        if params.get("label_smoothing") or params.get("size_average") is not None \
                or params.get("reduce") is not None:
            return None
        weight = params.get("weight")
        with torch.autocast("cpu", enabled=False):
            lsm = torch.log_softmax(x, 0 if x.dim() == 1 else 1, dtype=x.dtype)
            return F.nll_loss(lsm.float(), target,
                              weight=None if weight is None else weight.float(),
                              ignore_index=params.get("ignore_index", -100),
                              reduction=params.get("reduction", "mean"))

    def cpu(x: Any) -> Any:
        """A CUDA device, as a device, a name or an index, becomes the CPU."""
        if isinstance(x, torch.device) and x.type == "cuda":
            return torch.device("cpu")
        if isinstance(x, str) and x.startswith("cuda"):
            return "cpu"
        return x

    moves = {T.to, T.cuda, T.pin_memory}

    class CudaBehaviour(TorchFunctionMode):
        vramfit_capture = True

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if "device" in kwargs:
                kwargs = dict(kwargs, device=cpu(kwargs["device"]))
            if kwargs.get("generator") is not None:
                # random numbers drawn from a generator of the script's (a
                # data loader's shuffle): real values on the host
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            if func in moves:
                # the capture's tensors stay on the CPU: the step's own
                # .cuda() / .to("cuda") keep them there
                if func is not T.to:
                    return args[0]
                rest = [cpu(a) for a in args[1:]]
                if rest and isinstance(rest[0], int) and not isinstance(rest[0], bool):
                    rest[0] = "cpu"
                return func(args[0], *rest, **kwargs)
            autocast = torch.is_autocast_enabled("cpu")
            if func is F.scaled_dot_product_attention:
                return sdpa(args, kwargs, autocast)
            if func in grouped_mms:
                return grouped_mm(args, kwargs)
            if func in rms_norms:
                return rms_norm(args, kwargs, autocast)
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
            if autocast and func in cpu_promote:
                with torch.autocast("cpu", enabled=False):
                    return func(*args, **kwargs)
            if autocast and func is F.cross_entropy:
                loss = cross_entropy(args, kwargs)
                if loss is not None:
                    return loss
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
    """The model, its parameters and buffers on the meta device (no memory,
    no initialisation cost).

    The constructor runs under ``torch.device("meta")``. One that computes
    with tensors while it builds (torchvision's RegNet works its stage
    widths out with ``torch.arange(...).tolist()``) cannot read a meta
    tensor's values; it is run again with only the parameters and buffers
    going to the meta device as they are registered, other tensors on the
    CPU as usual.
    """
    import torch

    fn = _load_callable(spec)
    try:
        with torch.device("meta"):
            model = _construct(fn, spec, config, attention)
    except (NotImplementedError, RuntimeError) as e:
        if "meta" not in str(e):
            raise
        with _registered_on_meta():
            model = _construct(fn, spec, config, attention)
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"--model: '{spec}' returned {type(model).__name__}, not an nn.Module")
    return model


def _construct(fn: Callable[..., Any], spec: str, config: Dict[str, Any],
               attention: Optional[str]) -> Any:
    if not is_transformers(spec):
        return fn(**config)
    cfg_cls = getattr(fn, "config_class", None)
    auto = cfg_cls is None and hasattr(fn, "from_config")
    if auto:
        # an Auto class (AutoModelForCausalLM, ...): the config's model_type
        # names the model, as from_config reads it
        import transformers

        kind = config.get("model_type")
        if not kind:
            raise CaptureError(f"--model: '{spec}' is an Auto class; the config must name its "
                               "model_type")
        rest = {k: v for k, v in config.items() if k != "model_type"}
        try:
            cfg = transformers.AutoConfig.for_model(kind, **rest)
        except ValueError as e:
            raise CaptureError(f"--model: '{spec}': {e}") from e
    elif cfg_cls is None:
        raise CaptureError(f"--model: '{spec}' is not a transformers model class")
    else:
        cfg = cfg_cls.from_dict(dict(config))
    if attention:
        cfg._attn_implementation = attention
    if getattr(cfg, "is_encoder_decoder", False) and getattr(cfg, "decoder_start_token_id", None) is None:
        # `labels=` makes the decoder's inputs by shifting the labels right
        # behind this token (T5: the pad token); only its presence matters here
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
    build = fn.from_config if auto else getattr(fn, "_from_config", None)
    if build is not None:
        try:
            return build(cfg, attn_implementation=attention) if attention else build(cfg)
        except TypeError:
            return build(cfg)
    return fn(cfg)


@contextlib.contextmanager
def _registered_on_meta() -> Any:
    """Parameters and buffers go to the meta device as modules register them."""
    import torch

    Module = torch.nn.Module
    register_parameter, register_buffer = Module.register_parameter, Module.register_buffer

    def parameter(self: Any, name: str, param: Any) -> None:
        register_parameter(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            self._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    def buffer(self: Any, name: str, tensor: Any, persistent: bool = True) -> None:
        register_buffer(self, name, tensor, persistent)
        b = self._buffers.get(name)
        if b is not None and b.device.type != "meta":
            self._buffers[name] = b.to("meta")

    # nn.Linear, nn.Conv2d and the like create their weights with torch.empty:
    # made on the meta device, they never take host memory
    def empty(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return torch_empty(*args, **kwargs)

    torch_empty = torch.empty
    Module.register_parameter, Module.register_buffer = parameter, buffer  # type: ignore[method-assign]
    torch.empty = empty
    try:
        yield
    finally:
        Module.register_parameter, Module.register_buffer = register_parameter, register_buffer  # type: ignore[method-assign]
        torch.empty = torch_empty


def _fake_like(t: Any, dtype: Any) -> Any:
    """An empty tensor of ``t``'s shape and layout on the CPU, in ``dtype``
    when it is a floating-point tensor and a dtype is given (fake under the
    capture's mode; ``t`` itself is not read)."""
    import torch

    dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
    if t.is_contiguous():
        return torch.empty(t.shape, dtype=dt, device="cpu")
    return torch.empty_strided(t.shape, t.stride(), dtype=dt, device="cpu")


def materialize(model: Any, dtype: Any, optimizers: Sequence[Any] = ()) -> Dict[int, Any]:
    """Gives every parameter and buffer fake storage on the CPU, in the order
    ``model.to(device, dtype)`` converts them (children first), tied tensors
    once. The model's own tensors (meta, CPU or CUDA) are replaced, not read;
    ``optimizers`` are pointed at the new parameters and their state is
    dropped. Returns the replacements by the id of the tensor replaced."""
    import torch

    done: Dict[int, Any] = {}  # id of the old tensor -> (its replacement, the old tensor)

    def walk(m: Any) -> None:
        for child in m.children():
            walk(child)
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                done[id(p)] = (torch.nn.Parameter(_fake_like(p, dtype), requires_grad=p.requires_grad), p)
            m._parameters[name] = done[id(p)][0]
        for name, b in list(m._buffers.items()):
            if b is None:
                continue
            if id(b) not in done:
                done[id(b)] = (_fake_like(b, dtype), b)
            m._buffers[name] = done[id(b)][0]

    walk(model)
    for opt in optimizers:
        for group in opt.param_groups:
            group["params"] = [done[id(p)][0] if id(p) in done else p for p in group["params"]]
        opt.state.clear()
    return {k: v[0] for k, v in done.items()}


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


_active = 0  # captures entered and not yet left


def capturing() -> bool:
    """True inside a capture (a step run under it is being recorded)."""
    return _active > 0


class _HostMemory:
    """The process's peak resident memory over a stretch of time: Linux's
    high-water mark (VmHWM), reset at the start through
    ``/proc/self/clear_refs``; where that cannot be done, the process's
    lifetime peak (``getrusage``)."""

    def __init__(self) -> None:
        self.reset = False
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            pass

    def peak(self) -> int:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Capture:
    """A capture in progress: fake tensors on the CPU, the allocation
    recorder and the CUDA-behaviour rules, entered as a context manager
    (``__enter__`` and ``__exit__`` may also be called from two hooks of a
    training loop, as the adapters do).

    ::

        with Capture() as cap:
            cap.adopt(model, optimizers=[optimizer])
            ...  # training steps
        profile = cap.profile(micro_batch=8)
    """

    def __init__(self) -> None:
        self.rec = _Recorder()
        self.seconds = 0.0
        self.peak_host_bytes = 0
        self._stack: Optional[contextlib.ExitStack] = None
        self._t0 = 0.0
        self._host: Optional[_HostMemory] = None

    def __enter__(self) -> "Capture":
        from torch._subclasses.fake_tensor import FakeTensorMode

        global _active
        self._host = _HostMemory()
        self._t0 = time.perf_counter()
        stack = contextlib.ExitStack()
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(_dispatch_mode(self.rec))
        stack.enter_context(_function_mode())
        stack.enter_context(_recompute_in_mode())
        stack.enter_context(_foreach_as_on_cuda())
        stack.enter_context(_autocast_on_cpu())
        stack.enter_context(_unpacked_sequences())
        self._stack = stack
        _active += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        global _active
        if self._stack is not None:
            _active -= 1
            self._stack.__exit__(*exc)
            self._stack = None
        self.seconds = time.perf_counter() - self._t0
        assert self._host is not None
        self.peak_host_bytes = self._host.peak()

    def adopt(self, model: Any, dtype: Any = None, optimizers: Sequence[Any] = ()) -> None:
        """Gives ``model``'s parameters and buffers fake storage (see
        :func:`materialize`); ``dtype`` converts the floating-point ones."""
        materialize(model, dtype, optimizers)

    def profile(self, micro_batch: int, grad_accum: int = 1,
                info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The recorded events in the ``vramfit.profile/v1`` form."""
        import torch

        capture_info: Dict[str, Any] = {"tool": "vramfit.profile", "mode": "fake-cpu",
                                        "torch": torch.__version__}
        # The modelling libraries the step imported: a capture holds for the
        # versions it ran (a library's release can change what a model
        # allocates, as transformers' T5 and Qwen2-MoE did between 5.17 and 5.24).
        versions = ((name, getattr(sys.modules.get(name), "__version__", None))
                    for name in MODELLING_LIBRARIES)
        capture_info["libraries"] = {name: v for name, v in versions if v}
        capture_info.update(info or {})
        capture_info.update({"seconds": round(self.seconds, 3),
                             "peakHostBytes": self.peak_host_bytes,
                             "dataDependentReads": self.rec.data_reads})
        return to_profile(self.rec, micro_batch, grad_accum, capture_info)


@contextlib.contextmanager
def _foreach_as_on_cuda() -> Iterator[None]:
    """An optimizer left to choose its implementation (``foreach=None``, the
    default) asks PyTorch at its step, which picks the multi-tensor
    (foreach) one for parameters on a device with foreach kernels: on a GPU,
    with its whole-list temporaries, while the capture's parameters are on
    the CPU and would get the one-tensor-at-a-time loop. The capture counts
    the CPU among those devices; each optimizer still decides as it does
    (Adafactor, which never defaults to foreach, keeps its loop)."""
    import torch.optim.optimizer as optimizer
    from torch._subclasses.fake_tensor import FakeTensor

    devices = optimizer._get_foreach_kernels_supported_devices
    types = optimizer._foreach_supported_types
    optimizer._get_foreach_kernels_supported_devices = lambda: [*devices(), "cpu"]
    # the capture's parameters are fake tensors, a type of their own
    optimizer._foreach_supported_types = [*types, FakeTensor]
    try:
        yield
    finally:
        optimizer._get_foreach_kernels_supported_devices = devices
        optimizer._foreach_supported_types = types


@contextlib.contextmanager
def _recompute_in_mode() -> Iterator[None]:
    """A checkpointed function recomputed in backward runs inside autograd's
    engine, where no torch-function mode is active (PyTorch keeps dispatch
    modes there, not function modes): without this, the capture's CUDA rules
    (fused attention, autocast's fp32 list, fused dropout) would not apply to
    the recomputation, and a non-reentrant checkpoint would find its
    recomputed tensors unlike the forward's. The function checkpointing
    runs (reentrant or not) enters the capture's function mode when none is
    active."""
    import torch.utils.checkpoint as ckpt
    from torch.overrides import _get_current_function_mode_stack

    def in_mode(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if any(getattr(m, "vramfit_capture", False) for m in _get_current_function_mode_stack()):
                return fn(*args, **kwargs)
            with _function_mode():
                return fn(*args, **kwargs)
        return run

    def wrap_generator(orig: Any) -> Any:
        def generator(fn: Any, *args: Any, **kwargs: Any) -> Any:
            return orig(in_mode(fn), *args, **kwargs)
        return generator

    # The non-reentrant generator takes the function first; newer PyTorch
    # moved it to `..._impl` (the old name calls it), other arguments vary.
    name = next(n for n in ("_checkpoint_without_reentrant_generator_impl",
                            "_checkpoint_without_reentrant_generator") if hasattr(ckpt, n))
    generator = getattr(ckpt, name)
    forward = ckpt.CheckpointFunction.forward

    def reentrant_forward(ctx: Any, run_function: Any, *args: Any) -> Any:
        return forward(ctx, in_mode(run_function), *args)

    setattr(ckpt, name, wrap_generator(generator))
    ckpt.CheckpointFunction.forward = staticmethod(reentrant_forward)
    try:
        yield
    finally:
        setattr(ckpt, name, generator)
        ckpt.CheckpointFunction.forward = staticmethod(forward)


@contextlib.contextmanager
def _autocast_on_cpu() -> Any:
    """``torch.autocast("cuda", ...)`` in the captured code becomes CPU
    autocast (with CUDA's default dtype, fp16, when none is given): the
    capture's tensors are on the CPU, and its rules make CPU autocast
    behave as CUDA's."""
    import torch

    cls = torch.amp.autocast_mode.autocast
    init = cls.__init__

    def cpu_init(self: Any, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_type == "cuda":
            device_type = "cpu"
            if dtype is None:
                dtype = torch.get_autocast_dtype("cuda")
        init(self, device_type, dtype, *args, **kwargs)

    cls.__init__ = cpu_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__ = init  # type: ignore[method-assign]


@contextlib.contextmanager
def _unpacked_sequences() -> Any:
    """transformers looks for packed sequences in the position ids of a step
    without a cache or an attention mask (a training step with gradient
    checkpointing), and treats a fake tensor as tracing: it then builds the
    full causal mask, where the GPU run, seeing one sequence per row, lets
    SDPA apply causality itself (no mask, and grouped-query heads without
    repeated keys and values). Fake position ids have no values to look at;
    a training step's usual answer is one sequence per row."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    mod = sys.modules.get("transformers.masking_utils")
    find = getattr(mod, "find_packed_sequence_indices", None)
    if mod is None or find is None:
        yield
        return

    def unpacked(position_ids: Any) -> Any:
        if isinstance(position_ids, FakeTensor) or (
                isinstance(position_ids, torch.Tensor) and position_ids.device.type == "meta"):
            return None
        return find(position_ids)

    mod.find_packed_sequence_indices = unpacked
    try:
        yield
    finally:
        mod.find_packed_sequence_indices = find


def capture(model_spec: str, config: Dict[str, Any], batch: int, precision: str,
            optimizer: str, input_shape: Optional[Sequence[int]] = None,
            seq_len: Optional[int] = None, steps: int = STEPS, grad_accum: int = 1,
            checkpointing: bool = False, attention: Optional[str] = None,
            num_classes: Optional[int] = None,
            zero_grad: Optional[str] = None) -> Dict[str, Any]:
    """Runs the capture and returns the profile as a dict."""
    import torch
    import torch.nn.functional as F

    if precision not in PRECISIONS:
        raise CaptureError(f"--precision must be one of {', '.join(PRECISIONS)}, got '{precision}'")
    if optimizer not in OPTIMIZERS:
        raise CaptureError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got '{optimizer}'")
    if batch < 1 or steps < 1 or grad_accum < 1:
        raise CaptureError("--batch, --steps and --grad-accum must be at least 1")
    hf = is_transformers(model_spec)
    if hf and not seq_len and not model_spec.endswith("ForImageClassification"):
        raise CaptureError("--seq-len is needed for a transformers model (not for an "
                           "image classifier, which takes pixels at its config's image_size)")
    if not hf and not input_shape:
        raise CaptureError("--input (e.g. 3x224x224) is needed for a model that is not from transformers")
    zero_grad = zero_grad or ("after-step" if hf else "before-backward")
    if zero_grad not in ("after-step", "before-backward"):
        raise CaptureError("--zero-grad must be after-step or before-backward")
    pure = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    amp = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(precision)

    t0 = time.perf_counter()
    model = build_on_meta(model_spec, config, attention)
    cap = Capture()
    with cap:
        cap.adopt(model, pure)
        if hf and hasattr(model, "tie_weights"):
            model.tie_weights()  # ties are kept by materialize; this re-ties if the class unties
        if checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise CaptureError("--checkpointing needs a model with gradient_checkpointing_enable()")
            # The library's default (non-reentrant) checkpointing; its
            # recomputation in backward gets the capture's function mode
            # from `_recompute_in_mode`.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False})
        model.train()
        opt = make_optimizer(optimizer, model.parameters())
        scaler = _Scaler() if precision == "amp-fp16" else None
        if hf and type(model).__name__.endswith("ForImageClassification"):
            # what an image processor and a collator hand the loop: pixels
            # at the config's size and one class label per image
            cfg = model.config
            side, channels = int(cfg.image_size), int(getattr(cfg, "num_channels", 3))
            labels = int(getattr(cfg, "num_labels", 2))

            def make_batch() -> Dict[str, Any]:
                x = torch.randn(batch, channels, side, side)
                if pure is not None:
                    x = x.to(pure)
                return {"pixel_values": x, "labels": torch.randint(0, labels, (batch,))}
        elif hf:
            vocab = int(getattr(model.config, "vocab_size", 0) or 0)
            if vocab <= 0:
                raise CaptureError("the transformers config has no vocab_size (and the model "
                                   "is no ...ForImageClassification)")
            encoder = getattr(model.config, "model_type", "") == "bert" or \
                type(model).__name__.endswith("ForMaskedLM")

            def make_batch() -> Dict[str, Any]:
                ids = torch.randint(0, vocab, (batch, int(seq_len or 0)))
                b = {"input_ids": ids, "labels": ids.clone()}
                if encoder and getattr(model.config, "type_vocab_size", 0):
                    b["token_type_ids"] = torch.zeros(batch, int(seq_len or 0), dtype=torch.long)
                return b

        if hf:
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
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if zero_grad == "after-step":
                opt.zero_grad()
        del outputs, loss, b
    cap.seconds = time.perf_counter() - t0
    return cap.profile(batch, grad_accum, {
        "model": model_spec, "precision": precision, "optimizer": optimizer,
        "steps": steps, "checkpointing": checkpointing, "attention": attention,
        "zeroGrad": zero_grad,
        "input": list(input_shape) if input_shape else None, "seqLen": seq_len,
    })


def capture_step(model: Any, step_fn: Callable[[Any], Any], *, micro_batch: int,
                 steps: int = STEPS, grad_accum: int = 1, optimizers: Sequence[Any] = (),
                 dtype: Any = None, source: Optional[str] = None) -> Dict[str, Any]:
    """Captures the allocation profile of arbitrary training code.

    ``step_fn(model)`` runs one whole training step of ``model`` the way the
    script does it (forward, backward, optimizer step, clearing the
    gradients); it is called ``steps`` times (the first creates the
    optimizer's state, the later ones are the steady state) under the capture, on
    the CPU, with no GPU and no memory for tensors. ``micro_batch`` is the
    samples per forward pass the step uses and ``grad_accum`` the forward
    passes per optimizer step: the profile is a prediction for them.

    ``model``'s parameters and buffers (on the meta device, the CPU or a GPU)
    are replaced by fake ones, in ``model.to("cuda")``'s order and in
    ``dtype`` if given; the ``optimizers`` built on them are pointed at the
    new ones and their state is dropped. The model is not usable for
    training afterwards: capture a fresh one (build it under
    ``torch.device("meta")`` to spend no memory on its weights).

    Inside ``step_fn``, tensors stay on the CPU (``.cuda()`` and
    ``.to("cuda")`` keep them there, ``torch.autocast("cuda")`` is CPU
    autocast with the capture's CUDA rules), and ``.item()`` or ``bool()``
    of a value no fake tensor has answers the usual value (see the
    profile-format docs).
    """
    if steps < 1 or micro_batch < 1 or grad_accum < 1:
        raise CaptureError("steps, micro_batch and grad_accum must be at least 1")
    cap = Capture()
    with cap:
        cap.adopt(model, dtype, optimizers)
        for _ in range(steps):
            step_fn(model)
    return cap.profile(micro_batch, grad_accum, {
        "model": source or type(model).__name__, "steps": steps, "api": "capture_step"})


def _accumulate_in_place(rec: _Recorder) -> Tuple[List[Tuple[str, int]], Any, int]:
    """The recorded events with autograd's gradient accumulation made in
    place, as CUDA runs it, and a map of the old event positions to the new.

    When two gradients meet in one input buffer (a tied word table, the
    residual stream's two branches) the engine adds the second into the
    first if it holds the only reference to it and neither is a tensor
    subclass; fake tensors are one, so the capture sees ``old + new``: a new
    tensor of the same size, then both freed. The H200's recorded runs
    (GPT-2 and DeBERTa-v3's tied tables) add in place. Such a sum (a
    backward ``add`` of two same-sized gradients, both freed right after it)
    becomes the older one: its allocation and the older one's free go, its
    later frees are the older one's."""
    ev = rec.events
    size_of: List[int] = [v for k, v in ev if k == "a"]
    drop: set = set()
    alias: Dict[int, int] = {}

    def resolve(i: int) -> int:
        while i in alias:
            i = alias[i]
        return i

    index = -1
    for pos, (kind, value) in enumerate(ev):
        if kind != "a":
            continue
        index += 1
        if index not in rec.backward_sums or pos + 2 >= len(ev):
            continue
        (k1, a), (k2, b) = ev[pos + 1], ev[pos + 2]
        if k1 != "f" or k2 != "f" or not size_of[a] == size_of[b] == value:
            continue
        older = min(a, b)
        drop.update((pos, pos + 1 if a == older else pos + 2))
        alias[index] = older
    renumber: Dict[int, int] = {}
    events: List[Tuple[str, int]] = []
    index = -1
    for pos, (kind, value) in enumerate(ev):
        if kind == "a":
            index += 1
            if pos not in drop:
                renumber[index] = len(renumber)
        if pos in drop:
            continue
        events.append((kind, value) if kind == "a" else ("f", renumber[resolve(value)]))
    before = [0] * (len(ev) + 1)
    for pos in range(len(ev)):
        before[pos + 1] = before[pos] + (pos in drop)

    def moved(pos: int) -> int:
        return pos - before[pos]

    live = peak = 0
    live_sizes: Dict[int, int] = {}
    index = -1
    for kind, value in events:
        if kind == "a":
            index += 1
            live_sizes[index] = value
            live += value
            peak = max(peak, live)
        else:
            live -= live_sizes.pop(value)
    return events, moved, peak


def to_profile(rec: _Recorder, micro_batch: int, grad_accum: int,
               capture_info: Dict[str, Any]) -> Dict[str, Any]:
    """The recorded events in the vramfit.profile/v1 form."""
    recorded, moved, peak = _accumulate_in_place(rec)
    sizes = sorted({v for k, v in recorded if k == "a"})
    index = {s: i for i, s in enumerate(sizes)}
    events = [index[v] if k == "a" else -(v + 1) for k, v in recorded]
    allocations = sum(1 for k, _ in recorded if k == "a")
    return {"format": FORMAT, "microBatch": micro_batch, "gradAccum": grad_accum,
            "sizes": sizes, "events": events,
            "cublasWorkspaceAt": [moved(at) for at in rec.workspace_at],
            "convolutions": [dict(c, at=moved(c["at"])) for c in rec.convolutions],
            "reductions": [dict(r, at=moved(r["at"])) for r in rec.reductions],
            "source": f"vramfit.profile {capture_info.get('model', '')}".rstrip(),
            "capture": dict(capture_info, peakLiveBytes=peak, allocations=allocations)}


def summary(prof: Dict[str, Any]) -> str:
    """One line about a capture, for stderr."""
    c = prof.get("capture", {})
    return (f"captured {c.get('allocations', 0)} allocations, {len(prof['events'])} events, "
            f"live peak {c.get('peakLiveBytes', 0) / 2**30:.3f} GiB in {c.get('seconds', 0):.1f} s, "
            f"peak host memory {c.get('peakHostBytes', 0) / 2**20:.0f} MiB")



# ------------------------------------------------------ automatic profiling

#: ``VRAMFIT_PHASE=profile``: run one captured step, report the profile and exit.
PHASE_VARIABLE = "VRAMFIT_PHASE"
#: Where the profile JSON is written as well, when set.
PROFILE_OUT_VARIABLE = "VRAMFIT_PROFILE_OUT"
#: Start of the stdout line that carries the profile (base64 of its gzip).
PROFILE_PREFIX = "vramfit-profile: "
#: Start of the stdout line that says why the capture failed.
ERROR_PREFIX = "vramfit-profile-error: "
#: Exit status of a failed capture.
ERROR_EXIT_CODE = 3
#: The longest profile line that also goes to the termination log.
TERMINATION_LINE_MAX = 4096


def profile_phase(env: Optional[Dict[str, str]] = None) -> bool:
    """True when the controller started this process to profile it."""
    source = os.environ if env is None else env
    return source.get(PHASE_VARIABLE, "").strip().lower() == "profile"


def profile_line(prof: Dict[str, Any]) -> str:
    """``vramfit-profile: `` and the base64 (standard alphabet, no newlines)
    of the gzip of the compact profile JSON."""
    data = gzip.compress(json.dumps(prof, separators=(",", ":")).encode(), mtime=0)
    return PROFILE_PREFIX + base64.b64encode(data).decode("ascii")


def decode_profile_line(line: str) -> Dict[str, Any]:
    """The profile a :func:`profile_line` carries."""
    text = line.strip()
    if not text.startswith(PROFILE_PREFIX.strip()):
        raise ValueError("not a vramfit-profile line")
    data = base64.b64decode(text[len(PROFILE_PREFIX.strip()):].strip(), validate=True)
    return json.loads(gzip.decompress(data))  # type: ignore[no-any-return]


def _termination_log() -> str:
    from .attempt import DEFAULT_TERMINATION_LOG

    return os.environ.get("VRAMFIT_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG


def _write_termination_log(text: str) -> None:
    path = _termination_log()
    if not (os.path.exists(path) and os.access(path, os.W_OK)):
        return
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


def report_profile(prof: Dict[str, Any]) -> None:
    """The protocol's output for a profile: the file, the stdout line and,
    when the line fits, the termination log."""
    out = os.environ.get(PROFILE_OUT_VARIABLE)
    if out:
        with open(out, "w") as f:
            f.write(json.dumps(prof, separators=(",", ":")))
    line = profile_line(prof)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if len(line.encode()) <= TERMINATION_LINE_MAX:
        _write_termination_log(line)
    print(f"vramfit: {summary(prof)}", file=sys.stderr)


def report_error(exc: BaseException) -> None:
    """The protocol's output for a failed capture: one line on stdout and in
    the termination log."""
    message = " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]
    line = ERROR_PREFIX + message
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    _write_termination_log(line)


def exit_process(code: int) -> NoReturn:
    """Ends the process at once (no framework teardown runs on the fake
    tensors the capture left behind)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def finish_profile_phase(make_profile: Callable[[], Dict[str, Any]]) -> NoReturn:
    """Runs ``make_profile`` (a capture), reports its profile and exits 0;
    a failure is reported and exits :data:`ERROR_EXIT_CODE`."""
    try:
        prof = make_profile()
    except Exception as exc:  # noqa: BLE001 - every failure is the protocol's error line
        import traceback

        traceback.print_exc()
        report_error(exc)
        exit_process(ERROR_EXIT_CODE)
    report_profile(prof)
    exit_process(0)


class LoopProfile:
    """The protocol inside a training loop that the adapters hook: ``start``
    before the first step (the model and optimizers exist), ``finish`` after
    optimizer step ``STEPS``; a failure in between (an exception that
    reaches the top of the process) is reported as the protocol's error."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.capture: Optional[Capture] = None
        self._hook: Any = None

    def start(self, model: Any, optimizers: Sequence[Any]) -> None:
        try:
            self.capture = Capture().__enter__()
            self.capture.adopt(model, None, [o for o in optimizers if o is not None])
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
        self._hook = sys.excepthook

        def hook(kind: Any, exc: BaseException, tb: Any) -> None:
            self._hook(kind, exc, tb)
            self.fail(exc)

        sys.excepthook = hook

    def finish(self, micro_batch: int, grad_accum: int = 1, steps: int = STEPS) -> NoReturn:
        def make() -> Dict[str, Any]:
            assert self.capture is not None
            self.capture.__exit__(None, None, None)
            return self.capture.profile(micro_batch, grad_accum,
                                        {"model": self.source, "steps": steps})

        finish_profile_phase(make)

    def fail(self, exc: BaseException) -> NoReturn:
        report_error(exc)
        exit_process(ERROR_EXIT_CODE)


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
    ap.add_argument("--steps", type=int, default=STEPS)
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
    print(summary(prof), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
