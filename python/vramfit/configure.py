"""``configure()``: the attempt's budget and batch shape, applied before the first CUDA allocation."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import warnings
from typing import Any, Mapping, Optional

from . import state
from .attempt import Attempt, ConfigError, from_env
from .oom import write_termination_log
from .shape import ShapeReporter

#: Exit code of a process whose container lacks the GPU its attempt was
#: placed on: the controller tries the attempt again at the same shape.
NO_GPU_EXIT_CODE = 43
#: What the termination message of :data:`NO_GPU_EXIT_CODE` says first.
NO_GPU_MARK = "vramfit: no GPU device"
#: Values of ``NVIDIA_VISIBLE_DEVICES`` that name no GPU.
_NO_DEVICES = {"", "void", "none"}

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


def missing_gpu(env: Mapping[str, str], dev: str = "/dev") -> Optional[str]:
    """Why this container lacks the GPUs its attempt was placed on, or None.

    vramfit names the placed GPUs in ``NVIDIA_VISIBLE_DEVICES``; the node's
    device injection (CDI through the agent's NRI plugin, or the NVIDIA
    runtime) then adds a ``/dev/nvidiaN`` node for each. A container created
    while the injection was not running (its plugin's pod being replaced)
    has none, and would fail later in CUDA for a reason the controller could
    not tell from a bug. The profile phase (CPU only) and a simulated GPU
    (``VRAMFIT_SIMULATED_GPU``, the development node's stand-in) expect no
    device node.
    """
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if visible.lower() in _NO_DEVICES or env.get("VRAMFIT_PHASE") == "profile":
        return None
    if env.get("VRAMFIT_SIMULATED_GPU"):
        return None
    try:
        names = os.listdir(dev)
    except OSError:
        names = []
    if any(re.fullmatch(r"nvidia[0-9]+", n) for n in names):
        return None
    return (
        f"{NO_GPU_MARK}: the attempt was placed on {visible}, but this container has no "
        f"{dev}/nvidiaN device (the node's device injection did not run for it)"
    )


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
    dev: str = "/dev",
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

    Under vramfit, a container that lacks the GPU its attempt was placed on
    (:func:`missing_gpu`; ``dev`` is where device nodes are looked for) ends
    here: the reason goes to the termination log and the process exits with
    :data:`NO_GPU_EXIT_CODE`, which the controller retries at the same shape.
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
    if attempt.managed:
        why = missing_gpu(source, dev)
        if why is not None:
            written = write_termination_log(why, attempt.termination_log)
            where = f" (written to {written})" if written else ""
            print(f"{why}; exiting with {NO_GPU_EXIT_CODE}{where}", file=sys.stderr)
            raise SystemExit(NO_GPU_EXIT_CODE)
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
