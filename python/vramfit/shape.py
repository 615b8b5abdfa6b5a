"""``shape-<pid>.json``: the batch shape the process runs with, for the node agent.

The format is in ``docs/node-protocol.md``. The file is replaced atomically
(a temporary name in the same folder, then a rename) when the process starts,
at once when the shape changes, and every few seconds in between so that the
agent, which ignores files older than 10 s, keeps seeing it.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

#: Seconds between refreshes of an unchanged file (the agent's limit is 10 s).
REFRESH_SECONDS = 3.0


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
            return {
                "version": 1,
                "pid": self.pid,
                "microBatch": self.micro_batch,
                "gradAccum": self.grad_accum,
                "globalBatch": self.global_batch,
                "attempt": self.attempt,
                "absorbedOoms": [oom.to_json() for oom in self.absorbed],
                "updatedUnixMs": int(time.time() * 1000),
            }

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
