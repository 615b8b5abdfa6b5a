"""The process's current attempt and shape reporter, set by ``configure()``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

from .attempt import Attempt, from_env

if TYPE_CHECKING:
    from .shape import ShapeReporter

_lock = threading.Lock()
_attempt: Optional[Attempt] = None
_reporter: Optional["ShapeReporter"] = None


def attempt() -> Attempt:
    """The attempt ``configure()`` returned; before it ran, the one the environment describes."""
    with _lock:
        current = _attempt
    if current is not None:
        return current
    try:
        return from_env(micro_batch=1)
    except Exception:
        return Attempt(micro_batch=1, grad_accum=1, global_batch=1)


def set_attempt(value: Optional[Attempt]) -> None:
    """Replaces the current attempt (``configure()`` and tests)."""
    global _attempt
    with _lock:
        _attempt = value


def shape_reporter() -> Optional["ShapeReporter"]:
    """The reporter that keeps ``shape-<pid>.json`` current, when there is a stats folder."""
    with _lock:
        return _reporter


def set_shape_reporter(value: Optional["ShapeReporter"]) -> None:
    """Replaces the reporter, stopping the previous one."""
    global _reporter
    with _lock:
        previous, _reporter = _reporter, value
    if previous is not None and previous is not value:
        previous.stop()
