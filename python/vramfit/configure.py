"""``configure()``: the attempt's budget and batch shape, applied before the first CUDA allocation."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any, Mapping, Optional

from . import state
from .attempt import Attempt, ConfigError, from_env
from .shape import ShapeReporter

#: ``VRAMFIT_ALLOCATOR=native`` keeps PyTorch's own allocator even when vramfit's is installed.
ALLOCATOR_VARIABLE = "VRAMFIT_ALLOCATOR"


def _install_allocator(budget_bytes: int, env: Mapping[str, str]) -> bool:
    if env.get(ALLOCATOR_VARIABLE, "").strip().lower() == "native":
        return False
    try:
        from . import allocator  # type: ignore[attr-defined]
    except ImportError:
        return False
    return bool(allocator.install(budget_bytes))


def _nvidia_driver_present() -> bool:
    # Importing torch takes seconds; without a driver there is nothing to limit.
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def _apply_fraction(attempt: Attempt, device: Optional[int]) -> bool:
    if "torch" not in sys.modules and not _nvidia_driver_present():
        return False
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    index = attempt.local_rank if device is None else device
    if index >= torch.cuda.device_count():
        raise ConfigError(
            f"device {index} is not visible ({torch.cuda.device_count()} CUDA device(s))"
        )
    # PyTorch's fraction caps what its allocator reserves, so it gets the
    # allocator's part of the budget; VRAMFIT_MEMORY_FRACTION (the whole
    # budget over the GPU) serves only when no budget in bytes was given.
    fraction = attempt.memory_fraction
    allocator_budget = attempt.allocator_budget_bytes
    if allocator_budget is not None:
        total = torch.cuda.get_device_properties(index).total_memory
        fraction = min(1.0, allocator_budget / total)
    assert fraction is not None
    if torch.cuda.is_initialized() and torch.cuda.memory_reserved(index) > 0:
        warnings.warn(
            "vramfit.configure() ran after CUDA memory was allocated; the budget only "
            "limits what is allocated from now on",
            stacklevel=3,
        )
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return True


def configure(
    micro_batch: Optional[int] = None,
    grad_accum: Optional[int] = None,
    global_batch: Optional[int] = None,
    *,
    min_micro_batch: int = 1,
    device: Optional[int] = None,
    termination_log: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Attempt:
    """Reads the attempt's variables, applies the budget and returns the batch shape.

    Call it at the start of the script, before anything touches CUDA. Under
    vramfit it returns the attempt's micro-batch, accumulation and global batch
    (the arguments are ignored) and limits this process to its budget: through
    vramfit's allocator when ``vramfit.allocator`` is present and
    ``VRAMFIT_ALLOCATOR`` is not ``native``, otherwise through
    ``torch.cuda.set_per_process_memory_fraction``. Outside vramfit it changes
    nothing and returns the arguments (two of micro, accumulation and global
    batch are enough).

    When ``VRAMFIT_STATS_DIR`` is set it publishes ``shape-<pid>.json`` there.
    """
    source: Mapping[str, str] = os.environ if env is None else env
    attempt = from_env(
        source,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        global_batch=global_batch,
        min_micro_batch=min_micro_batch,
        termination_log=termination_log,
    )
    enforcement = "none"
    if attempt.managed and (attempt.budget_bytes or attempt.memory_fraction):
        allocator_budget = attempt.allocator_budget_bytes
        if allocator_budget and _install_allocator(allocator_budget, source):
            enforcement = "allocator"
        elif _apply_fraction(attempt, device):
            enforcement = "fraction"
    attempt = dataclasses.replace(attempt, enforcement=enforcement)
    state.set_attempt(attempt)
    if attempt.stats_dir:
        state.set_shape_reporter(
            ShapeReporter(
                attempt.stats_dir,
                micro_batch=attempt.micro_batch,
                grad_accum=attempt.grad_accum,
                global_batch=attempt.global_batch,
                attempt=attempt.attempt,
            )
        )
    else:
        state.set_shape_reporter(None)
    if attempt.managed:
        print(
            f"vramfit: attempt {attempt.attempt}, micro-batch {attempt.micro_batch} x "
            f"accumulation {attempt.grad_accum} (global {attempt.global_batch}), "
            f"budget {_describe_budget(attempt)} via {enforcement}",
            file=sys.stderr,
        )
    return attempt


def _describe_budget(attempt: Attempt) -> str:
    if attempt.budget_bytes:
        text = f"{attempt.budget_bytes / 2**30:.2f} GiB"
        if attempt.context_bytes:
            text += (
                f" ({attempt.context_bytes / 2**30:.2f} GiB of it kept for the CUDA context"
                " and libraries)"
            )
        return text
    if attempt.memory_fraction:
        return f"{attempt.memory_fraction:.3f} of the GPU"
    return "none"


def current() -> Any:
    """The attempt ``configure()`` set last (or what the environment describes)."""
    return state.attempt()
