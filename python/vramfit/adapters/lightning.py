"""PyTorch Lightning: the attempt's shape, the OOM exit protocol, and OOM-safe manual steps.

Restart path (automatic optimisation)::

    attempt = vramfit.configure(micro_batch=8, grad_accum=4)
    loader = DataLoader(dataset, batch_size=attempt.micro_batch)
    trainer = L.Trainer(callbacks=[VramfitCallback()], **trainer_kwargs())

``VramfitCallback`` sets ``trainer.accumulate_grad_batches`` from the attempt and
turns an OOM anywhere in ``fit`` into the exit protocol (exit 42), after which
the controller starts the next attempt with half the micro-batch.

Under ``VRAMFIT_PHASE=profile`` the callback captures the first
``vramfit.profile.STEPS`` optimizer steps of ``fit`` on the CPU (the automatic-profiling protocol,
docs/profile-format.md), reports the profile and ends the process.

In-process (manual optimisation): Lightning's automatic loop draws one
micro-batch per ``training_step`` and steps the optimizer itself, so a failed
step cannot be re-run with smaller micro-batches from outside it. With
``automatic_optimization = False`` the module receives the rank's whole batch
(``batch_size = attempt.rank_batch``) and :func:`oom_safe_step` runs it through
:class:`vramfit.Step`, which absorbs OOMs inside the process::

    def training_step(self, batch, batch_idx):
        return oom_safe_step(self, batch, lambda m, b: m.loss(b)).loss
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

import lightning.pytorch as pl

from .. import profile, state
from ..attempt import Attempt
from ..oom import exit_on_oom, is_oom
from ..shape import report_progress
from ..step import Step, StepResult, batch_size


def trainer_kwargs(attempt: Optional[Attempt] = None) -> Dict[str, Any]:
    """``Trainer`` arguments for the attempt's shape (automatic optimisation)."""
    current = attempt or state.attempt()
    return {"accumulate_grad_batches": current.grad_accum}


class VramfitCallback(pl.Callback):
    """Takes accumulation from the attempt and follows the OOM exit protocol.

    After each batch it reports progress (:func:`vramfit.progress`):
    ``trainer.global_step`` (optimizer steps) of
    ``trainer.estimated_stepping_batches`` when Lightning can tell it.
    """

    def __init__(self, attempt: Optional[Attempt] = None, *, hard_exit: bool = True) -> None:
        self.attempt = attempt
        self.hard_exit = hard_exit
        self._profiling: Optional[profile.LoopProfile] = None
        self._first_step = 0
        self._total_steps: Optional[int] = None

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        current = self.attempt or state.attempt()
        if pl_module.automatic_optimization:
            trainer.accumulate_grad_batches = current.grad_accum

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._total_steps = _total_steps(trainer)
        if profile.profile_phase() and not profile.capturing():
            self._profiling = profile.LoopProfile(f"lightning {type(pl_module).__name__}")
            self._first_step = trainer.global_step
            self._profiling.start(pl_module, trainer.optimizers)

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        report_progress(trainer.global_step, self._total_steps)
        if self._profiling is None or trainer.global_step - self._first_step < profile.STEPS:
            return
        current = self.attempt or state.attempt()
        try:
            micro = batch_size(batch)
        except (ValueError, TypeError):
            micro = current.micro_batch
        accum = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
        self._profiling.finish(micro, accum)

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        if self._profiling is not None:
            self._profiling.fail(exception)
        if is_oom(exception):
            exit_on_oom(exception, hard=self.hard_exit)


def _total_steps(trainer: "pl.Trainer") -> Optional[int]:
    """``trainer.estimated_stepping_batches`` when it is a finite count
    (it is infinite without ``max_steps`` or ``max_epochs``, and some
    loaders have no length)."""
    try:
        total = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - an estimate is optional
        return None
    if isinstance(total, float) and not math.isfinite(total):
        return None
    try:
        total = int(total)
    except (TypeError, ValueError, OverflowError):
        return None
    return total if total > 0 else None


_STEP_ATTRIBUTE = "_vramfit_step"


def oom_safe_step(
    module: "pl.LightningModule",
    batch: Any,
    loss_fn: Callable[[Any, Any], Any],
    *,
    attempt: Optional[Attempt] = None,
    **step_options: Any,
) -> StepResult:
    """One OOM-safe optimizer step inside a manual-optimisation ``training_step``.

    The :class:`vramfit.Step` is made on the first call (with the module's
    optimizer and ``manual_backward``, so precision plugins apply) and kept on
    the module, so a micro-batch it backed off to stays for later steps.
    """
    step: Optional[Step] = getattr(module, _STEP_ATTRIBUTE, None)
    if step is None:
        optimizer = module.optimizers()
        if isinstance(optimizer, list):
            raise ValueError("oom_safe_step drives one optimizer; the module has several")
        trainer = getattr(module, "_trainer", None)
        if trainer is not None:
            # Progress as the callback reports it: the trainer's step count.
            step_options.setdefault("total_steps", _total_steps(trainer))
            step_options.setdefault("start_step", trainer.global_step)
        step = Step(module, optimizer, attempt=attempt, backward=module.manual_backward, **step_options)
        setattr(module, _STEP_ATTRIBUTE, step)
    return step.run(batch, loss_fn)
