"""An OOM-safe training step: the rank's batch in micro-batches, backed off inside the process.

``Step.run(batch, loss_fn)`` computes the gradient of the whole batch as a sum of
micro-batch gradients, each loss scaled by its share of the batch, so the
result equals one full-batch backward pass (up to floating-point summation
order). When a micro-batch runs out of memory, the step drops the partial
gradients and everything the failed pass referenced, empties PyTorch's cache,
halves the micro-batch with the controller's policy (``vramfit.backoff``) and
runs the same step again from the first sample: no sample counts twice and the
optimizer steps once. Below ``minMicro`` it follows the exit protocol and the
controller's restart path takes over.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Mapping, NoReturn, Optional, Sequence, Tuple

from . import state
from .attempt import Attempt
from .backoff import BatchShape, Fail, after_oom
from .oom import exit_on_oom, is_oom, oom_message, release_memory
from .shape import AbsorbedOom, report_progress

LossFn = Callable[[Any, Any], Any]


@dataclass
class StepResult:
    """What one optimizer step did."""

    #: The batch's mean loss (the sum of the micro-batch losses weighted by their share).
    loss: float
    #: Micro-batch the step finished with.
    micro_batch: int
    #: Micro-batches the step finished with.
    micro_steps: int
    #: OOMs absorbed during this step, oldest first.
    absorbed: List[AbsorbedOom] = field(default_factory=list)
    #: Seconds from the first absorbed OOM to the end of the optimizer step (0 without one).
    recovery_seconds: float = 0.0


def batch_size(batch: Any) -> int:
    """Samples in ``batch``: the first dimension of its tensors, which must agree."""
    sizes = {int(t.shape[0]) for t in _tensors(batch)}
    if not sizes:
        raise ValueError("the batch holds no tensor to split")
    if len(sizes) > 1:
        raise ValueError(f"the batch's tensors disagree on the batch dimension: {sorted(sizes)}")
    return sizes.pop()


def split_batch(batch: Any, micro: int) -> Iterator[Tuple[Any, int]]:
    """Yields ``(micro_batch, samples)`` slices of ``micro`` samples along the first dimension.

    Tensors, and tuples, lists and mappings of them, are sliced; other values
    are passed to every micro-batch unchanged. The last slice is shorter when
    ``micro`` does not divide the batch.
    """
    if micro < 1:
        raise ValueError(f"micro-batch {micro} must be at least 1")
    total = batch_size(batch)
    for start in range(0, total, micro):
        stop = min(start + micro, total)
        yield _slice(batch, start, stop), stop - start


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _tensors(value: Any) -> Iterator[Any]:
    if _is_tensor(value):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _slice(value: Any, start: int, stop: int) -> Any:
    if _is_tensor(value):
        return value[start:stop]
    if isinstance(value, Mapping):
        sliced = {key: _slice(item, start, stop) for key, item in value.items()}
        try:
            return type(value)(sliced)
        except TypeError:
            return sliced
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_slice(item, start, stop) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_slice(item, start, stop) for item in value)
    return value


class Step:
    """One optimizer step over the rank's batch, absorbing OOMs by smaller micro-batches.

    ``loss_fn(model, micro_batch)`` returns the micro-batch's loss, reduced as
    ``reduction`` says: ``"mean"`` (a mean over its samples, the default; each
    loss is weighted by ``samples / batch``) or ``"sum"`` (weighted by 1).
    With a token-mean language-model loss the equality with the full batch is
    exact when every sample has the same number of counted tokens.

    Under ``DistributedDataParallel`` (``WORLD_SIZE`` > 1) the micro-batches run
    on the wrapped module without DDP's hooks, the ranks agree on whether any of
    them ran out of memory, back off together, and the gradients are averaged
    once at the end. FSDP and other sharded wrappers are not supported: use the
    exit protocol there.

    An OOM inside ``optimizer.step()`` cannot be retried (part of the parameters
    may have moved), so it follows the exit protocol.

    Each optimizer step is reported as progress (:func:`vramfit.progress`):
    ``steps`` counts from ``start_step`` (set it when resuming from a
    checkpoint), of ``total_steps`` when given, so the controller can tell
    when the job ends.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        scaler: Any = None,
        *,
        attempt: Optional[Attempt] = None,
        micro_batch: Optional[int] = None,
        min_micro_batch: Optional[int] = None,
        global_batch: Optional[int] = None,
        world_size: Optional[int] = None,
        reduction: str = "mean",
        max_grad_norm: Optional[float] = None,
        backward: Optional[Callable[[Any], None]] = None,
        exit_on_failure: bool = True,
        total_steps: Optional[int] = None,
        start_step: int = 0,
    ) -> None:
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', not {reduction!r}")
        current = attempt or state.attempt()
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.micro_batch = micro_batch or current.micro_batch
        self.min_micro_batch = min_micro_batch or current.min_micro_batch
        self.world_size = world_size or current.world_size
        self.global_batch = global_batch or (
            current.global_batch if attempt is not None or current.managed else None
        )
        self.reduction = reduction
        self.max_grad_norm = max_grad_norm
        self.backward = backward
        self.exit_on_failure = exit_on_failure
        self.absorbed: List[AbsorbedOom] = []
        #: Optimizer steps done (from ``start_step``).
        self.steps = start_step
        self.total_steps = total_steps
        self._distributed = self._is_distributed()
        if self.world_size > 1 and not self._distributed:
            raise ValueError(
                "WORLD_SIZE > 1 needs the DistributedDataParallel model and an initialised "
                "process group, so that all ranks back off together"
            )

    @property
    def grad_accum(self) -> int:
        """Accumulation steps of the global batch at the current micro-batch."""
        if self.global_batch is None:
            return 1
        return self.global_batch // (self.micro_batch * self.world_size)

    def run(self, batch: Any, loss_fn: LossFn) -> StepResult:
        """Runs one optimizer step over ``batch`` (this rank's share of the global batch).

        Under ``VRAMFIT_PHASE=profile`` the first call captures the step's
        allocation profile instead, reports it and ends the process
        (:meth:`profile_and_exit`).
        """
        if _profile_phase():
            self.profile_and_exit(batch, loss_fn)
        total = batch_size(batch)
        absorbed_here: List[AbsorbedOom] = []
        first_oom: Optional[float] = None
        while True:
            failure: Optional[str] = None
            try:
                loss = self._accumulate(batch, total, loss_fn)
            except Exception as exc:  # noqa: BLE001 - anything else is re-raised at once
                if not is_oom(exc):
                    raise
                failure = oom_message(exc)
                release_memory(exc)
                del exc
                loss = None
            if self._distributed:
                failure = self._agree_on_failure(failure)
            if failure is None:
                break
            if first_oom is None:
                first_oom = time.perf_counter()
            self._drop_gradients()
            absorbed_here.append(self._back_off(failure, total))
        self._all_reduce_gradients()
        self._optimizer_step()
        self.steps += 1
        report_progress(self.steps, self.total_steps)
        assert loss is not None
        return StepResult(
            loss=float(loss),
            micro_batch=self.micro_batch,
            micro_steps=math.ceil(total / self.micro_batch),
            absorbed=absorbed_here,
            recovery_seconds=0.0 if first_oom is None else time.perf_counter() - first_oom,
        )

    def profile_and_exit(self, batch: Any, loss_fn: LossFn) -> NoReturn:
        """The automatic-profiling protocol (docs/profile-format.md): this
        step, as :meth:`run` runs it at the attempt's micro-batch, captured
        twice (the first creates the optimizer's state) on the CPU with no
        GPU memory, the profile reported, the process ended with status 0
        (3 when the capture fails). Two micro-batches of ``batch`` at most
        are run per step: more accumulate the same way."""
        from . import profile

        def make() -> Any:
            total = batch_size(batch)
            micro = min(self.micro_batch, total)
            passes = min(2, math.ceil(total / micro))
            part = _slice(batch, 0, min(total, micro * passes))

            def step(_model: Any) -> None:
                self._accumulate(part, batch_size(part), loss_fn)
                self._optimizer_step()

            return profile.capture_step(
                self._forward_module(), step, micro_batch=micro, grad_accum=passes,
                optimizers=[self.optimizer], source="vramfit.Step",
            )

        profile.finish_profile_phase(make)

    # The micro-batch loop lives in its own frame: after an OOM the traceback's
    # frames are cleared, which drops the activations their locals reference.
    def _accumulate(self, batch: Any, total: int, loss_fn: LossFn) -> Any:
        self.optimizer.zero_grad(set_to_none=True)
        module = self._forward_module()
        accumulated = None
        low_precision = _low_precision_types()
        for chunk, samples in split_batch(batch, self.micro_batch):
            weight = samples / total if self.reduction == "mean" else 1.0
            with self._no_sync():
                loss = loss_fn(module, chunk)
                scaled = loss * weight
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                if self.backward is not None:
                    self.backward(scaled)
                else:
                    scaled.backward()
            part = loss.detach()
            if part.dtype in low_precision:
                part = part.float()
            part = part * weight
            accumulated = part if accumulated is None else accumulated + part
            del loss, scaled, chunk
        return accumulated

    def _back_off(self, failure: str, total: int) -> AbsorbedOom:
        global_batch = self.global_batch or total * self.world_size
        current = BatchShape(self.micro_batch, max(1, global_batch // (self.micro_batch * self.world_size)))
        decision = after_oom(global_batch, self.world_size, current, self.min_micro_batch, 0, sys.maxsize)
        if isinstance(decision, Fail):
            self._give_up(f"{failure}\n\nvramfit: in-process back-off stopped: {decision.reason}")
        nxt = decision.shape
        reporter = state.shape_reporter()
        if reporter is not None:
            oom = reporter.record_absorbed(current.micro, current.accum, nxt.micro, nxt.accum)
        else:
            oom = AbsorbedOom(current.micro, nxt.micro, current.accum, nxt.accum, int(time.time() * 1000))
        print(
            f"vramfit: OOM absorbed in-process: micro {current.micro} -> {nxt.micro}, "
            f"accumulation {current.accum} -> {nxt.accum}",
            file=sys.stderr,
        )
        self.absorbed.append(oom)
        self.micro_batch = nxt.micro
        return oom

    def _give_up(self, message: str) -> None:
        error = _oom_error(message)
        if self.exit_on_failure:
            exit_on_oom(error)
        raise error

    def _drop_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        release_memory()

    def _optimizer_step(self) -> None:
        try:
            if self.scaler is not None:
                if self.max_grad_norm is not None:
                    self.scaler.unscale_(self.optimizer)
                    self._clip()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                if self.max_grad_norm is not None:
                    self._clip()
                self.optimizer.step()
        except Exception as exc:  # noqa: BLE001
            if not is_oom(exc) or not self.exit_on_failure:
                raise
            exit_on_oom(exc)

    def _clip(self) -> None:
        import torch

        torch.nn.utils.clip_grad_norm_(self._forward_module().parameters(), self.max_grad_norm)

    # Distributed data parallel: hooks off during the micro-batches, one agreement
    # on failure and one gradient average per step.
    def _is_distributed(self) -> bool:
        torch = sys.modules.get("torch")
        if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
            return False
        return hasattr(self.model, "no_sync") and hasattr(self.model, "module")

    def _forward_module(self) -> Any:
        return self.model.module if self._distributed else self.model

    def _no_sync(self) -> Any:
        import contextlib

        # The micro-batches run on the wrapped module, so DDP's reducer is not
        # armed; no_sync makes sure of it should the user's loss_fn call the wrapper.
        return self.model.no_sync() if self._distributed else contextlib.nullcontext()

    def _agree_on_failure(self, failure: Optional[str]) -> Optional[str]:
        import torch
        import torch.distributed as dist

        device = _grad_device(self._forward_module())
        flag = torch.tensor([0 if failure is None else 1], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() == 0:
            return None
        return failure or f"{_OOM_TEXT} on another rank (in-process back-off)"

    def _all_reduce_gradients(self) -> None:
        if not self._distributed:
            return
        import torch.distributed as dist

        grads = [p.grad for p in self._forward_module().parameters() if p.grad is not None]
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for work in works:
            work.wait()
        for g in grads:
            g.div_(self.world_size)


_OOM_TEXT = "CUDA out of memory"


def _profile_phase() -> bool:
    """``VRAMFIT_PHASE=profile``, outside a capture already running (a step
    inside a training loop that an adapter captures runs as usual)."""
    from . import profile

    return profile.profile_phase() and not profile.capturing()


def _low_precision_types() -> tuple:
    import torch

    return (torch.float16, torch.bfloat16)


def _oom_error(message: str) -> BaseException:
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return oom_type(message)


def _grad_device(module: Any) -> Any:
    for parameter in module.parameters():
        return parameter.device
    return "cpu"

