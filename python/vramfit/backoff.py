"""The OOM back-off policy: half the micro-batch, more accumulation, the same global batch.

This is the Python twin of ``src/job/backoff.rs``; both are tested
against ``tests/data/backoff-cases.json`` so they make the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union


@dataclass(frozen=True)
class BatchShape:
    """The batch shape of an attempt: micro-batch per GPU and accumulation steps."""

    micro: int
    accum: int

    @staticmethod
    def for_micro(global_batch: int, micro: int, gpus: int) -> Optional["BatchShape"]:
        """The shape for ``micro`` when ``global_batch`` divides evenly by ``micro * gpus``."""
        per_step = micro * gpus
        if per_step <= 0 or global_batch % per_step != 0:
            return None
        return BatchShape(micro, global_batch // per_step)

    def display(self) -> str:
        """``micro x accum``, as ``kubectl get`` shows it."""
        return f"{self.micro}x{self.accum}"


@dataclass(frozen=True)
class Retry:
    """Run again with this shape."""

    shape: BatchShape


@dataclass(frozen=True)
class Fail:
    """Give up; the reason in words."""

    reason: str


Decision = Union[Retry, Fail]


def after_oom(
    global_batch: int,
    gpus: int,
    current: BatchShape,
    min_micro: int,
    oom_retries_used: int,
    max_retries: int,
) -> Decision:
    """Decides what follows an out-of-memory error.

    The next micro-batch is the largest value not above half the current one
    that keeps ``global / (micro * gpus)`` whole (12 -> 6 -> 3 -> 1 for a global
    batch of 48); below ``min_micro`` or past ``max_retries`` it fails.
    """
    if oom_retries_used >= max_retries:
        return Fail(
            f"out of memory at micro-batch {current.micro} after {oom_retries_used} retries "
            f"(maxOOMRetries {max_retries})"
        )
    for micro in range(current.micro // 2, max(min_micro, 1) - 1, -1):
        shape = BatchShape.for_micro(global_batch, micro, gpus)
        if shape is not None:
            return Retry(shape)
    return Fail(
        f"out of memory at micro-batch {current.micro} and no smaller micro-batch at or above "
        f"minMicro {min_micro} divides the global batch {global_batch} over {gpus} GPU(s)"
    )
