"""A stand-in training script for `vramfit run --local` tests.

It goes through the real helper (configure, the OOM guard, the shape file) but
fakes the memory: a micro-batch above FAKE_FITS_MICRO "runs out of memory" with
PyTorch's text (the helper also accepts the RuntimeError PyTorch once raised,
so no torch is needed). FAKE_ABSORB_ABOVE makes the process absorb one OOM
itself first, as vramfit.Step does. Each attempt appends its VRAMFIT_* variables
to FAKE_LOG.
"""

import json
import os

import vramfit
from vramfit import state

attempt = vramfit.configure(micro_batch=4)
fits = int(os.environ["FAKE_FITS_MICRO"])
absorb_above = int(os.environ.get("FAKE_ABSORB_ABOVE", "0"))
with open(os.environ["FAKE_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps({k: v for k, v in os.environ.items() if k.startswith("VRAMFIT_")}) + "\n")

micro, accum = attempt.micro_batch, attempt.grad_accum
with vramfit.oom_guard(hard=False):
    if absorb_above and micro > absorb_above:
        reporter = state.shape_reporter()
        assert reporter is not None, "VRAMFIT_STATS_DIR was not set"
        reporter.record_absorbed(micro, accum, micro // 2, accum * 2)
        micro, accum = micro // 2, accum * 2
    if micro > fits:
        raise RuntimeError(f"CUDA out of memory. Tried to allocate {micro} GiB (fake)")
print(f"trained at micro-batch {micro} x {accum}")
