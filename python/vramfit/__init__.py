"""Training-side helper for vramfit.

The controller starts each attempt of a TrainingJob with a memory budget and a
batch shape in environment variables (``docs/node-protocol.md``). A training
script calls :func:`configure` first, runs its loop under :class:`oom_guard`
(or steps with :class:`Step`, which absorbs OOMs inside the process), and the
controller does the rest; :func:`progress` (called by :class:`Step` and the
adapters) reports how far the training has come. Importing the package does
not import torch.
"""

from __future__ import annotations

from .attempt import OOM_EXIT_CODE, Attempt, ConfigError
from .backoff import BatchShape, after_oom
from .configure import NO_GPU_EXIT_CODE, configure, current
from .oom import exit_on_oom, guarded, is_oom, oom_guard
from .shape import report_progress as progress
from .step import Step, StepResult, split_batch

__version__ = "0.1.0"

__all__ = [
    "NO_GPU_EXIT_CODE",
    "OOM_EXIT_CODE",
    "Attempt",
    "BatchShape",
    "ConfigError",
    "Step",
    "StepResult",
    "__version__",
    "after_oom",
    "configure",
    "current",
    "exit_on_oom",
    "guarded",
    "is_oom",
    "oom_guard",
    "progress",
    "split_batch",
]
