"""Hugging Face Trainer: the attempt's shape in ``TrainingArguments`` and the OOM exit protocol.

::

    attempt = vramfit.configure(micro_batch=8, grad_accum=4)
    args = TrainingArguments(output_dir="out", **training_args_kwargs())
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[VramfitTrainerCallback()])
    train(trainer)      # trainer.train() under the OOM exit protocol

Under ``VRAMFIT_PHASE=profile`` the callback captures the Trainer's first
``vramfit.profile.STEPS`` optimizer steps on the CPU (the automatic-profiling protocol,
docs/profile-format.md), reports the profile and ends the process;
:func:`train` adds the callback when the Trainer has none.

In-process absorption is not available here: ``Trainer`` draws each micro-batch
from its own data loader, calls ``training_step`` once per micro-batch and steps
the optimizer itself, so a step cannot be re-run from its first sample with a
smaller micro-batch from a callback (``auto_find_batch_size`` restarts the whole
loop and changes the global batch instead). An OOM ends the process with exit
42 and the controller's restart path takes over.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import transformers

from .. import profile, state
from ..attempt import Attempt, ConfigError
from ..oom import oom_guard
from ..shape import report_progress


def training_args_kwargs(attempt: Optional[Attempt] = None) -> Dict[str, Any]:
    """``TrainingArguments`` fields for the attempt's shape."""
    current = attempt or state.attempt()
    return {
        "per_device_train_batch_size": current.micro_batch,
        "gradient_accumulation_steps": current.grad_accum,
    }


def apply_attempt(args: "transformers.TrainingArguments", attempt: Optional[Attempt] = None) -> "transformers.TrainingArguments":
    """A copy of ``args`` with the attempt's micro-batch and accumulation."""
    return dataclasses.replace(args, **training_args_kwargs(attempt))


class VramfitTrainerCallback(transformers.TrainerCallback):
    """Checks at the start of training that the Trainer runs the attempt's shape.

    A Trainer built with other values would train another global batch than the
    TrainingJob says, and the controller's back-off would not reach it.

    Under ``VRAMFIT_PHASE=profile`` it captures the Trainer's first
    ``vramfit.profile.STEPS`` optimizer steps (from ``on_train_begin`` to that
    ``on_step_end``),
    reports the profile and ends the process.

    After each optimizer step it reports progress (:func:`vramfit.progress`):
    ``state.global_step`` of ``state.max_steps``, which the Trainer sets from
    ``max_steps`` or from the epochs and the data loader's length.
    """

    def __init__(self, attempt: Optional[Attempt] = None) -> None:
        self.attempt = attempt
        self._profiling: Optional[profile.LoopProfile] = None
        self._first_step = 0

    def on_train_begin(self, args: Any, state_: Any, control: Any, **kwargs: Any) -> None:
        self._check_shape(args)
        if profile.profile_phase() and not profile.capturing():
            model = kwargs.get("model")
            self._profiling = profile.LoopProfile(f"transformers.Trainer {type(model).__name__}")
            self._first_step = state_.global_step
            self._profiling.start(model, [kwargs.get("optimizer")])

    def on_step_end(self, args: Any, state_: Any, control: Any, **kwargs: Any) -> None:
        if self._profiling is not None and state_.global_step - self._first_step >= profile.STEPS:
            self._profiling.finish(args.per_device_train_batch_size, args.gradient_accumulation_steps)
        total = getattr(state_, "max_steps", 0) or 0
        report_progress(state_.global_step, total if total > 0 else None)

    def _check_shape(self, args: Any) -> None:
        current = self.attempt or state.attempt()
        if not current.managed and self.attempt is None:
            return
        got = (args.per_device_train_batch_size, args.gradient_accumulation_steps)
        want = (current.micro_batch, current.grad_accum)
        if got != want:
            raise ConfigError(
                f"the Trainer runs micro-batch {got[0]} x accumulation {got[1]}, the attempt "
                f"{want[0]} x {want[1]}: build TrainingArguments with vramfit.adapters."
                "huggingface.training_args_kwargs()"
            )


def train(trainer: "transformers.Trainer", *, hard_exit: bool = True, **kwargs: Any) -> Any:
    """``trainer.train(**kwargs)`` with an OOM turned into the exit protocol
    (and, under ``VRAMFIT_PHASE=profile``, the profiling callback added when
    the Trainer has none)."""
    if profile.profile_phase() and not any(
        isinstance(cb, VramfitTrainerCallback) for cb in trainer.callback_handler.callbacks
    ):
        trainer.add_callback(VramfitTrainerCallback())
    with oom_guard(hard=hard_exit):
        return trainer.train(**kwargs)
