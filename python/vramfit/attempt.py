"""The attempt's facts, as the controller (or ``vramfit run --local``) passes them.

The variables are listed in ``docs/node-protocol.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

#: Exit code of a process that ran out of GPU memory (``VRAMFIT_OOM_EXIT_CODE``).
OOM_EXIT_CODE = 42

#: Where the container runtime reads the termination message from.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"


class ConfigError(ValueError):
    """A ``VRAMFIT_*`` variable or an argument that cannot be used."""


@dataclass(frozen=True)
class Attempt:
    """What one attempt of a TrainingJob runs with."""

    #: Micro-batch per GPU.
    micro_batch: int
    #: Gradient-accumulation steps.
    grad_accum: int
    #: Samples per optimizer step over all GPUs.
    global_batch: int
    #: Floor of the in-process back-off (``batch.minMicro``).
    min_micro_batch: int = 1
    #: Attempt number, from 1.
    attempt: int = 1
    #: Processes that share the global batch (``WORLD_SIZE``, 1 without torchrun).
    world_size: int = 1
    #: This process's GPU on its node (``LOCAL_RANK``).
    local_rank: int = 0
    #: The hard budget per GPU in bytes, when vramfit set one.
    budget_bytes: Optional[int] = None
    #: Budget / GPU total, when vramfit set one.
    memory_fraction: Optional[float] = None
    #: The part of the budget kept for memory outside the caching allocator
    #: (CUDA context, kernels, libraries, NCCL), when vramfit said.
    context_bytes: Optional[int] = None
    #: Exit code for the OOM protocol.
    oom_exit_code: int = OOM_EXIT_CODE
    #: Where the OOM message and memory summary go.
    termination_log: str = DEFAULT_TERMINATION_LOG
    #: Folder for ``shape-<pid>.json``, when vramfit gave one.
    stats_dir: Optional[str] = None
    #: True when the values came from vramfit, False when they are the script's own.
    managed: bool = False
    #: How the budget is enforced: ``allocator``, ``fraction`` or ``none``.
    enforcement: str = "none"

    @property
    def allocator_budget_bytes(self) -> Optional[int]:
        """What the caching allocator may reserve: the budget, which covers the
        whole process, minus the part kept outside the allocator."""
        if self.budget_bytes is None:
            return None
        return self.budget_bytes - (self.context_bytes or 0)

    @property
    def rank_batch(self) -> int:
        """Samples this process handles per optimizer step (``micro * accum``)."""
        return self.micro_batch * self.grad_accum


def budget_from_env(env: Mapping[str, str]) -> "tuple[Optional[int], Optional[int]]":
    """``VRAMFIT_BUDGET_BYTES`` (the whole process on the GPU) and
    ``VRAMFIT_CONTEXT_BYTES`` (its part outside the caching allocator), each
    None when unset; a context that leaves nothing of the budget is refused."""
    budget = _int(env, "VRAMFIT_BUDGET_BYTES", None, minimum=0)
    context = _int(env, "VRAMFIT_CONTEXT_BYTES", None, minimum=0)
    if budget is not None and context is not None and context >= budget:
        raise ConfigError(
            f"VRAMFIT_CONTEXT_BYTES {context} leaves nothing of VRAMFIT_BUDGET_BYTES "
            f"{budget} for the allocator"
        )
    return budget, context


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None, minimum: int = 1) -> Optional[int]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str) -> Optional[float]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{name}={value} must be in (0, 1]")
    return value


def is_managed(env: Mapping[str, str]) -> bool:
    """True when the process was started by vramfit (it sets the batch shape)."""
    return "VRAMFIT_MICRO_BATCH" in env


def from_env(
    env: Optional[Mapping[str, str]] = None,
    *,
    micro_batch: Optional[int] = None,
    grad_accum: Optional[int] = None,
    global_batch: Optional[int] = None,
    min_micro_batch: int = 1,
    termination_log: Optional[str] = None,
) -> Attempt:
    """Reads the attempt from the environment.

    Under vramfit the variables win over the arguments; outside it (no
    ``VRAMFIT_MICRO_BATCH``) the arguments are the script's own values and are
    returned as given, with the missing one of micro, accumulation and global
    batch worked out from the other two.
    """
    env = os.environ if env is None else env
    world = _int(env, "WORLD_SIZE", 1) or 1
    local_rank = _int(env, "LOCAL_RANK", 0, minimum=0) or 0
    log = termination_log or env.get("VRAMFIT_TERMINATION_LOG") or DEFAULT_TERMINATION_LOG
    exit_code = _int(env, "VRAMFIT_OOM_EXIT_CODE", OOM_EXIT_CODE) or OOM_EXIT_CODE
    stats_dir = env.get("VRAMFIT_STATS_DIR") or None
    if is_managed(env):
        micro = _int(env, "VRAMFIT_MICRO_BATCH")
        assert micro is not None
        accum = _int(env, "VRAMFIT_GRAD_ACCUM", 1) or 1
        total = _int(env, "VRAMFIT_GLOBAL_BATCH", micro * accum * world)
        assert total is not None
        if micro * accum * world != total:
            raise ConfigError(
                f"VRAMFIT_MICRO_BATCH {micro} x VRAMFIT_GRAD_ACCUM {accum} x WORLD_SIZE {world} "
                f"is not VRAMFIT_GLOBAL_BATCH {total}"
            )
        budget, context = budget_from_env(env)
        return Attempt(
            micro_batch=micro,
            grad_accum=accum,
            global_batch=total,
            min_micro_batch=_int(env, "VRAMFIT_MIN_MICRO_BATCH", 1) or 1,
            attempt=_int(env, "VRAMFIT_ATTEMPT", 1) or 1,
            world_size=world,
            local_rank=local_rank,
            budget_bytes=budget,
            memory_fraction=_float(env, "VRAMFIT_MEMORY_FRACTION"),
            context_bytes=context,
            oom_exit_code=exit_code,
            termination_log=log,
            stats_dir=stats_dir,
            managed=True,
        )
    micro, accum, total = _complete_shape(micro_batch, grad_accum, global_batch, world)
    return Attempt(
        micro_batch=micro,
        grad_accum=accum,
        global_batch=total,
        min_micro_batch=min_micro_batch,
        world_size=world,
        local_rank=local_rank,
        oom_exit_code=exit_code,
        termination_log=log,
        stats_dir=stats_dir,
        managed=False,
    )


def _complete_shape(
    micro: Optional[int], accum: Optional[int], total: Optional[int], world: int
) -> tuple:
    given = {"micro_batch": micro, "grad_accum": accum, "global_batch": total}
    for name, value in given.items():
        if value is not None and value < 1:
            raise ConfigError(f"{name}={value} must be at least 1")
    if micro is None:
        if total is None:
            raise ConfigError("outside vramfit, configure() needs micro_batch or global_batch")
        micro = total // ((accum or 1) * world)
    if accum is None:
        accum = 1 if total is None else total // (micro * world)
    if total is None:
        total = micro * accum * world
    if micro < 1 or accum < 1 or micro * accum * world != total:
        raise ConfigError(
            f"micro_batch {micro} x grad_accum {accum} x world size {world} is not global_batch {total}"
        )
    return micro, accum, total
