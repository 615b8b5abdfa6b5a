"""The OOM-safe step: splitting, loss scaling, retry from the start, one optimizer step.

Gradients after a recovered step are compared with one full-batch backward
pass. In float64 the only difference is the order of the sums, so the
tolerance is 1e-12 relative; in float32 it is 1e-5 relative and 1e-6 absolute
(a few ulps of float32 over 64 summands).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

import vramfit
from vramfit import Attempt, Step, split_batch, state
from vramfit.shape import ShapeReporter


def make_model(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    ).to(dtype)


def make_batch(n: int = 64, dtype: torch.dtype = torch.float64) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(n, 6, generator=g, dtype=dtype), "y": torch.randint(0, 3, (n,), generator=g)}


def mse_loss(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])


class OomInjector:
    """A loss function that raises PyTorch's OOM for micro-batches above ``limit``.

    ``at_call`` delays the first OOM to that micro-batch of the pass, so that
    partial gradients have been accumulated when it strikes.
    """

    def __init__(self, limit: int, at_call: int = 0) -> None:
        self.limit = limit
        self.at_call = at_call
        self.calls: List[int] = []
        self.ooms = 0

    def __call__(self, model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        n = batch["x"].shape[0]
        self.calls.append(n)
        loss = mse_loss(model, batch)
        if n > self.limit and sum(1 for c in self.calls if c == n) > self.at_call:
            self.ooms += 1
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} MiB (injected)")
        return loss


def reference_grads(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    ref = copy.deepcopy(model)
    ref.zero_grad()
    mse_loss(ref, batch).backward()
    return [p.grad.clone() for p in ref.parameters()]


def grads(model: torch.nn.Module) -> List[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


class RecordingOptimizer(torch.optim.SGD):
    def __init__(self, params: Any, model: torch.nn.Module) -> None:
        super().__init__(params, lr=0.1)
        self.model = model
        self.steps = 0
        self.grads_at_step: List[List[torch.Tensor]] = []

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        self.steps += 1
        self.grads_at_step.append(grads(self.model))
        return super().step(closure)


def attempt(micro: int, global_batch: int = 64, min_micro: int = 1) -> Attempt:
    return Attempt(micro_batch=micro, grad_accum=global_batch // micro, global_batch=global_batch, min_micro_batch=min_micro)


def test_split_batch_slices_every_tensor_and_keeps_the_rest() -> None:
    batch = {"x": torch.arange(10), "pair": (torch.arange(10), "tag"), "n": 3}
    parts = list(split_batch(batch, 4))
    assert [n for _, n in parts] == [4, 4, 2]
    assert parts[2][0]["x"].tolist() == [8, 9]
    assert parts[1][0]["pair"][0].tolist() == [4, 5, 6, 7] and parts[1][0]["pair"][1] == "tag"
    assert parts[0][0]["n"] == 3
    with pytest.raises(ValueError, match="disagree"):
        list(split_batch({"a": torch.zeros(3), "b": torch.zeros(4)}, 2))


@pytest.mark.parametrize("micro", [64, 16, 5])
def test_accumulated_gradient_equals_the_full_batch_gradient(micro: int) -> None:
    model = make_model()
    batch = make_batch()
    expected = reference_grads(model, batch)
    opt = RecordingOptimizer(model.parameters(), model)
    step = Step(model, opt, micro_batch=micro, global_batch=64)
    result = step.run(batch, mse_loss)
    assert opt.steps == 1
    assert result.micro_steps == -(-64 // micro)
    for got, want in zip(opt.grads_at_step[0], expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    full = mse_loss(copy.deepcopy(make_model()), batch).item()
    assert result.loss == pytest.approx(full, rel=1e-12)


def test_oom_mid_pass_drops_partial_gradients_and_reruns_the_whole_step(tmp_path: Path) -> None:
    model = make_model()
    batch = make_batch()
    expected = reference_grads(model, batch)
    reporter = ShapeReporter(str(tmp_path), micro_batch=16, grad_accum=4, global_batch=64, attempt=1, refresh_seconds=None)
    state.set_shape_reporter(reporter)
    # The third micro-batch of 16 fails: two micro-batches' gradients exist then.
    loss_fn = OomInjector(limit=8, at_call=2)
    opt = RecordingOptimizer(model.parameters(), model)
    step = Step(model, opt, attempt=attempt(16))
    result = step.run(batch, loss_fn)
    assert loss_fn.calls == [16, 16, 16] + [8] * 8, "the step must start over from the first sample"
    assert opt.steps == 1
    for got, want in zip(opt.grads_at_step[0], expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert (result.micro_batch, step.grad_accum, result.micro_steps) == (8, 8, 8)
    assert [(o.from_micro, o.to_micro, o.from_accum, o.to_accum) for o in result.absorbed] == [(16, 8, 4, 8)]
    assert result.recovery_seconds > 0
    doc = json.loads(Path(reporter.path).read_text())
    assert (doc["microBatch"], doc["gradAccum"]) == (8, 8)
    assert doc["absorbedOoms"][0]["fromMicro"] == 16 and doc["absorbedOoms"][0]["toAccum"] == 8


def test_back_off_goes_as_far_as_needed_and_then_stays() -> None:
    model = make_model()
    loss_fn = OomInjector(limit=3)
    opt = RecordingOptimizer(model.parameters(), model)
    step = Step(model, opt, attempt=attempt(12, global_batch=48))
    first = step.run(make_batch(48), loss_fn)
    # 12 -> 6 -> 3, the controller's sequence for a global batch of 48.
    assert [o.to_micro for o in first.absorbed] == [6, 3]
    second = step.run(make_batch(48), loss_fn)
    assert second.absorbed == [] and second.micro_batch == 3
    assert opt.steps == 2
    assert loss_fn.ooms == 2


def test_float32_with_grad_scaler_matches_within_float32_tolerance() -> None:
    model = make_model(torch.float32)
    batch = make_batch(64, torch.float32)
    expected = reference_grads(model, batch)
    # A GradScaler that is enabled on CPU scales and unscales; the step applies it.
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = RecordingOptimizer(model.parameters(), model)
    step = Step(model, opt, scaler, attempt=attempt(32), max_grad_norm=1e9)
    step.run(batch, OomInjector(limit=16, at_call=1))
    assert step.micro_batch == 16
    for got, want in zip(opt.grads_at_step[0], expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_parameters_after_recovered_steps_equal_a_reference_run() -> None:
    def train(micro: int, limit: int) -> List[torch.Tensor]:
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = Step(model, opt, attempt=attempt(micro))
        for i in range(4):
            step.run(make_batch(64), OomInjector(limit=limit))
        return [p.detach().clone() for p in model.parameters()]

    reference = train(64, limit=64)
    recovered = train(32, limit=8)
    for got, want in zip(recovered, reference):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_other_errors_are_not_retried() -> None:
    model = make_model()
    opt = RecordingOptimizer(model.parameters(), model)

    def broken(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        Step(model, opt, attempt=attempt(16)).run(make_batch(), broken)
    assert opt.steps == 0


def test_at_min_micro_the_step_gives_up_with_the_oom() -> None:
    model = make_model()
    opt = RecordingOptimizer(model.parameters(), model)
    step = Step(model, opt, attempt=attempt(16, min_micro=8), exit_on_failure=False)
    with pytest.raises(torch.OutOfMemoryError, match="minMicro 8") as info:
        step.run(make_batch(), OomInjector(limit=4))
    assert "CUDA out of memory" in str(info.value)
    assert opt.steps == 0
    assert [o.to_micro for o in step.absorbed] == [8]


def test_at_min_micro_the_process_follows_the_exit_protocol(tmp_path: Path) -> None:
    from test_oom import run_script

    log = tmp_path / "log"
    out = run_script(
        """
        import torch, vramfit
        vramfit.configure()
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def loss_fn(m, b):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        vramfit.Step(model, opt).run(torch.zeros(8, 4), loss_fn)
        """,
        {
            "VRAMFIT_MICRO_BATCH": "4",
            "VRAMFIT_GRAD_ACCUM": "2",
            "VRAMFIT_GLOBAL_BATCH": "8",
            "VRAMFIT_MIN_MICRO_BATCH": "2",
            "VRAMFIT_TERMINATION_LOG": str(log),
            "VRAMFIT_STATS_DIR": str(tmp_path / "stats"),
        },
    )
    assert out.returncode == 42, out.stderr
    assert "\n\nCUDA out of memory. Tried to allocate 1 GiB" in log.read_text()
    assert "minMicro 2" in log.read_text()
    shape = json.loads(next((tmp_path / "stats").glob("shape-*.json")).read_text())
    assert [(o["fromMicro"], o["toMicro"]) for o in shape["absorbedOoms"]] == [(4, 2)]
