"""The OOM exit protocol: PyTorch's message to the termination log, then exit 42.

The controller (and ``vramfit run --local``) treats an exit with
``VRAMFIT_OOM_EXIT_CODE`` whose termination message contains ``CUDA out of
memory`` as an out-of-memory failure, and starts the next attempt with half the
micro-batch.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import traceback
from types import TracebackType
from typing import Any, Callable, NoReturn, Optional, Type, TypeVar

from . import state

#: The text the controller looks for (PyTorch's own wording).
OOM_MARK = "CUDA out of memory"

F = TypeVar("F", bound=Callable[..., Any])


def _allocator_module() -> Any:
    try:
        from . import allocator  # type: ignore[attr-defined]
    except ImportError:
        return None
    return allocator


def is_oom(exc: BaseException) -> bool:
    """True for PyTorch's out-of-memory error and for the vramfit allocator's budget error."""
    torch = sys.modules.get("torch")
    if torch is not None:
        oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
            getattr(torch, "cuda", None), "OutOfMemoryError", None
        )
        if oom_type is not None and isinstance(exc, oom_type):
            return True
    alloc = _allocator_module()
    if alloc is not None:
        try:
            if alloc.is_budget_oom(exc):
                return True
        except Exception:  # a broken probe must not hide the real error
            pass
    # PyTorch before 1.13 raised a plain RuntimeError with the same text.
    return isinstance(exc, RuntimeError) and OOM_MARK in str(exc)


def release_memory(exc: Optional[BaseException] = None) -> None:
    """Frees what an OOM left behind: the failed frames' tensors and the cached blocks.

    The traceback of ``exc`` keeps every frame of the failed step alive, and
    with them the activations they reference; clearing the frames lets the
    garbage collector drop them, and ``empty_cache`` gives the cached blocks
    back to the driver.
    """
    if exc is not None and exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def oom_message(exc: BaseException) -> str:
    """The first line of the termination message: PyTorch's text, marked for the controller."""
    text = str(exc).strip() or type(exc).__name__
    if OOM_MARK not in text:
        text = f"{OOM_MARK}: {text}"
    return text


def _memory_summary() -> str:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return "(no CUDA memory summary: CUDA was not in use)"
    try:
        return str(torch.cuda.memory_summary())
    except Exception as err:  # the summary is a courtesy; the exit must happen
        return f"(memory summary failed: {err})"


# The kubelet keeps only the last 4096 bytes of a termination log, so the
# report puts the memory summary first and PyTorch's message last: the
# message, with the text the controller looks for, always survives.
TERMINATION_MESSAGE_LIMIT = 4096


def termination_report(message: str, summary: str, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """The termination log's text: as much of ``summary`` as fits, then ``message``."""
    tail = message.encode("utf-8")[: limit - 1]
    room = limit - len(tail) - 2
    head = summary.encode("utf-8")[:room] + b"\n\n" if room > 0 else b""
    return (head + tail).decode("utf-8", errors="ignore")


def write_termination_log(message: str, path: Optional[str] = None) -> Optional[str]:
    """Writes ``message`` to the termination log; returns the path written, or None."""
    target = path or state.attempt().termination_log
    try:
        with open(target, "w", encoding="utf-8") as out:
            out.write(message)
        return target
    except OSError:
        return None


def exit_on_oom(
    exc: BaseException,
    *,
    termination_log: Optional[str] = None,
    exit_code: Optional[int] = None,
    hard: bool = True,
) -> NoReturn:
    """Follows the OOM exit protocol for ``exc``; never returns.

    Frees what it can, writes PyTorch's message and ``torch.cuda.memory_summary()``
    to the termination log (and standard error), records the OOM in the shape
    file, and exits with ``VRAMFIT_OOM_EXIT_CODE``. ``hard`` uses ``os._exit``
    after flushing, so data-loader workers or a hung NCCL communicator cannot
    keep the process alive; ``hard=False`` raises ``SystemExit`` instead.
    """
    attempt = state.attempt()
    code = attempt.oom_exit_code if exit_code is None else exit_code
    message = oom_message(exc)
    release_memory(exc)
    report = termination_report(message, _memory_summary())
    written = write_termination_log(report, termination_log)
    where = f" (written to {written})" if written else ""
    print(f"vramfit: out of GPU memory, exiting with {code}{where}\n{message}", file=sys.stderr)
    reporter = state.shape_reporter()
    if reporter is not None:
        reporter.write_now()
    sys.stdout.flush()
    sys.stderr.flush()
    if hard:
        os._exit(code)
    raise SystemExit(code)


class oom_guard(contextlib.ContextDecorator):
    """Turns an out-of-memory error inside the block into the OOM exit protocol.

    Use it around the training loop, or as a decorator of ``main``::

        with vramfit.oom_guard():
            train()

    Other errors pass through unchanged.
    """

    def __init__(
        self,
        *,
        termination_log: Optional[str] = None,
        exit_code: Optional[int] = None,
        hard: bool = True,
    ) -> None:
        self.termination_log = termination_log
        self.exit_code = exit_code
        self.hard = hard

    def __enter__(self) -> "oom_guard":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool:
        if exc is not None and is_oom(exc):
            exit_on_oom(
                exc, termination_log=self.termination_log, exit_code=self.exit_code, hard=self.hard
            )
        return False


def guarded(func: F) -> F:
    """Decorator form of :class:`oom_guard` with the defaults."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with oom_guard():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
