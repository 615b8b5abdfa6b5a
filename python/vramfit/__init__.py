"""Training-side helper for vramfit.

The controller starts each attempt of a TrainingJob with a memory budget and a
batch shape in environment variables (see ``docs/node-protocol.md``). This
package is what a training script calls to honour them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
