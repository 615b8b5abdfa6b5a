"""``shape-<pid>.json``: the batch shape the process runs with, for the node agent.

The format is in ``docs/node-protocol.md``. The file is replaced atomically
(a temporary name in the same folder, then a rename) when the process starts,
at once when the shape changes, and every few seconds in between so that the
agent, which ignores files older than 10 s, keeps seeing it.

It also carries the training's progress (:meth:`ShapeReporter.record_progress`):
optimizer steps done, the total when the script knows it, and a smoothed
seconds per step, from which the controller estimates when the job ends. A
progress update is written at most once every :data:`PROGRESS_WRITE_SECONDS`
(the refresh writes the latest in between).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

#: Seconds between refreshes of an unchanged file (the agent's limit is 10 s).
REFRESH_SECONDS = 3.0

#: Shortest time between two writes for progress alone.
PROGRESS_WRITE_SECONDS = 3.0

#: Weight of the newest step time in the smoothed seconds per step.
STEP_TIME_SMOOTHING = 0.1


@dataclass
class Progress:
    """How far the training has come."""

    steps: int
    total_steps: Optional[int]
    seconds_per_step: Optional[float]
    unix_ms: int

    def to_json(self) -> Dict[str, Any]:
        """The protocol's camelCase object (unknown figures left out)."""
        out: Dict[str, Any] = {"steps": self.steps, "unixMs": self.unix_ms}
        if self.total_steps is not None:
            out["totalSteps"] = self.total_steps
        if self.seconds_per_step is not None:
            out["secondsPerStep"] = round(self.seconds_per_step, 6)
        return out


@dataclass(frozen=True)
class AbsorbedOom:
    """One OOM absorbed inside the process."""

    from_micro: int
    to_micro: int
    from_accum: int
    to_accum: int
    unix_ms: int

    def to_json(self) -> Dict[str, int]:
        """The protocol's camelCase object."""
        return {
            "fromMicro": self.from_micro,
            "toMicro": self.to_micro,
            "fromAccum": self.from_accum,
            "toAccum": self.to_accum,
            "unixMs": self.unix_ms,
        }


class ShapeReporter:
    """Keeps ``<stats_dir>/shape-<pid>.json`` current."""

    def __init__(
        self,
        stats_dir: str,
        *,
        micro_batch: int,
        grad_accum: int,
        global_batch: int,
        attempt: int,
        pid: Optional[int] = None,
        refresh_seconds: Optional[float] = REFRESH_SECONDS,
    ) -> None:
        self.stats_dir = stats_dir
        self.pid = os.getpid() if pid is None else pid
        self.micro_batch = micro_batch
        self.grad_accum = grad_accum
        self.global_batch = global_batch
        self.attempt = attempt
        self.absorbed: List[AbsorbedOom] = []
        self.progress: Optional[Progress] = None
        #: (monotonic seconds, steps) of the last progress recorded.
        self._last_step: Optional[Tuple[float, int]] = None
        #: Monotonic seconds of the last write progress asked for.
        self._progress_written: Optional[float] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        os.makedirs(stats_dir, exist_ok=True)
        self.write_now()
        if refresh_seconds:
            self._thread = threading.Thread(
                target=self._refresh, args=(refresh_seconds,), name="vramfit-shape", daemon=True
            )
            self._thread.start()

    @property
    def path(self) -> str:
        """The file this reporter writes."""
        return os.path.join(self.stats_dir, f"shape-{self.pid}.json")

    def document(self) -> Dict[str, Any]:
        """The file's content now."""
        with self._lock:
            doc: Dict[str, Any] = {
                "version": 1,
                "pid": self.pid,
                "microBatch": self.micro_batch,
                "gradAccum": self.grad_accum,
                "globalBatch": self.global_batch,
                "attempt": self.attempt,
                "absorbedOoms": [oom.to_json() for oom in self.absorbed],
                "updatedUnixMs": int(time.time() * 1000),
            }
            if self.progress is not None:
                doc["progress"] = self.progress.to_json()
            return doc

    def record_progress(
        self, steps: int, total_steps: Optional[int] = None, *, now: Optional[float] = None
    ) -> Progress:
        """Records ``steps`` optimizer steps done (of ``total_steps``, when known).

        The seconds per step is smoothed over the steps recorded so far
        (exponentially, :data:`STEP_TIME_SMOOTHING`); a step count that does
        not grow (a restart from an earlier checkpoint) starts the measurement
        over but keeps the last estimate. The file is written at once unless
        progress wrote it less than :data:`PROGRESS_WRITE_SECONDS` ago (the
        refresh thread writes the latest figures in between). ``now``
        (monotonic seconds) is for tests.
        """
        if steps < 0:
            raise ValueError(f"steps must not be negative, not {steps}")
        if total_steps is not None and total_steps < 1:
            total_steps = None
        clock = time.monotonic() if now is None else now
        with self._lock:
            per_step = self.progress.seconds_per_step if self.progress else None
            if self._last_step is not None:
                at, before = self._last_step
                if steps > before and clock > at:
                    sample = (clock - at) / (steps - before)
                    per_step = sample if per_step is None else (
                        STEP_TIME_SMOOTHING * sample + (1 - STEP_TIME_SMOOTHING) * per_step
                    )
            if self._last_step is None or steps != self._last_step[1]:
                self._last_step = (clock, steps)
            self.progress = Progress(steps, total_steps, per_step, int(time.time() * 1000))
            progress = self.progress
            due = (
                self._progress_written is None
                or clock - self._progress_written >= PROGRESS_WRITE_SECONDS
            )
            if due:
                self._progress_written = clock
        if due:
            self.write_now()
        return progress

    def record_absorbed(self, from_micro: int, from_accum: int, to_micro: int, to_accum: int) -> AbsorbedOom:
        """Records an OOM absorbed in the process and writes the file at once."""
        oom = AbsorbedOom(from_micro, to_micro, from_accum, to_accum, int(time.time() * 1000))
        with self._lock:
            self.absorbed.append(oom)
            self.micro_batch = to_micro
            self.grad_accum = to_accum
        self.write_now()
        return oom

    def write_now(self) -> None:
        """Replaces the file atomically; a failure to write is not the training's problem."""
        body = json.dumps(self.document(), separators=(",", ":"))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".shape-", suffix=".tmp", dir=self.stats_dir)
            # mkstemp makes the file 0600: the node agent reads it as another
            # user (root without CAP_DAC_OVERRIDE in the chart), so it must be
            # world-readable, as the allocator's stats file is.
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(body)
            os.replace(tmp, self.path)
        except OSError:
            pass

    def stop(self) -> None:
        """Stops the refresh thread (the file stays)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _refresh(self, every: float) -> None:
        while not self._stop.wait(every):
            self.write_now()


def report_progress(steps: int, total_steps: Optional[int] = None) -> Optional[Progress]:
    """Reports ``steps`` optimizer steps done, of ``total_steps`` when the
    script knows it, to the node agent (``vramfit.progress``).

    Call it after each optimizer step (or every few): the helper smooths the
    seconds per step and writes at most once every few seconds. The
    controller turns steps, total and step time into the job's expected end,
    which elastic placement weighs other jobs' waits with. Without a stats
    folder (not under vramfit, or before ``configure()``) it does nothing and
    returns ``None``.
    """
    from . import state

    reporter = state.shape_reporter()
    if reporter is None:
        return None
    return reporter.record_progress(int(steps), None if total_steps is None else int(total_steps))
