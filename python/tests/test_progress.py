"""Progress in ``shape-<pid>.json``: steps, the total and a smoothed step time,
from the plain API, :class:`vramfit.Step` and the framework adapters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

import vramfit
from vramfit import state
from vramfit.shape import ShapeReporter


def reporter(tmp_path: Path) -> ShapeReporter:
    r = ShapeReporter(str(tmp_path), micro_batch=4, grad_accum=2, global_batch=8, attempt=1,
                      pid=7, refresh_seconds=None)
    state.set_shape_reporter(r)
    return r


def on_disk(tmp_path: Path) -> Dict[str, Any]:
    return json.loads((tmp_path / "shape-7.json").read_text())


def test_a_file_without_progress_has_no_progress_key(tmp_path: Path) -> None:
    reporter(tmp_path)
    assert "progress" not in on_disk(tmp_path)


def test_steps_total_and_a_smoothed_step_time_are_written(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    first = r.record_progress(1, 100, now=10.0)
    assert (first.steps, first.total_steps, first.seconds_per_step) == (1, 100, None)
    assert on_disk(tmp_path)["progress"]["steps"] == 1
    assert "secondsPerStep" not in on_disk(tmp_path)["progress"]
    # Two steps in 4 s: 2 s per step, the first measurement taken as is.
    assert r.record_progress(3, 100, now=14.0).seconds_per_step == pytest.approx(2.0)
    # One step of 12 s moves the estimate by a tenth of the difference.
    assert r.record_progress(4, 100, now=26.0).seconds_per_step == pytest.approx(3.0)
    # The same step again changes nothing (nor the measuring point).
    assert r.record_progress(4, 100, now=27.0).seconds_per_step == pytest.approx(3.0)
    assert r.record_progress(5, 100, now=29.0).seconds_per_step == pytest.approx(0.1 * 3 + 0.9 * 3.0)
    doc = on_disk(tmp_path)["progress"]
    assert doc["totalSteps"] == 100 and doc["unixMs"] > 0
    # Resumed from an earlier checkpoint: the measurement starts over, the estimate stays.
    assert r.record_progress(2, 100, now=40.0).seconds_per_step == pytest.approx(3.0)
    assert r.record_progress(3, 100, now=41.0).seconds_per_step == pytest.approx(0.1 * 1 + 0.9 * 3.0)


def test_progress_writes_at_most_once_every_few_seconds(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    r.record_progress(1, None, now=100.0)
    assert on_disk(tmp_path)["progress"]["steps"] == 1
    r.record_progress(2, None, now=101.0)
    r.record_progress(3, None, now=102.9)
    assert on_disk(tmp_path)["progress"]["steps"] == 1, "written less than 3 s ago"
    # The refresh writes the latest figures in between.
    r.write_now()
    assert on_disk(tmp_path)["progress"]["steps"] == 3
    r.record_progress(4, None, now=103.0)
    assert on_disk(tmp_path)["progress"]["steps"] == 4
    assert "totalSteps" not in on_disk(tmp_path)["progress"]


def test_a_total_below_one_is_unknown_and_negative_steps_are_refused(tmp_path: Path) -> None:
    r = reporter(tmp_path)
    assert r.record_progress(1, 0, now=1.0).total_steps is None
    with pytest.raises(ValueError):
        r.record_progress(-1)


def test_the_plain_api_reports_through_the_configured_reporter(tmp_path: Path) -> None:
    assert vramfit.progress(5, 10) is None, "nothing to report to before configure()"
    reporter(tmp_path)
    reported = vramfit.progress(5, 10)
    assert reported is not None and (reported.steps, reported.total_steps) == (5, 10)
    assert on_disk(tmp_path)["progress"]["steps"] == 5


def test_configure_under_a_stats_folder_reports_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VRAMFIT_STATS_DIR", str(tmp_path))
    vramfit.configure(micro_batch=2)
    vramfit.progress(3, 30)
    files = list(tmp_path.glob("shape-*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["progress"]["totalSteps"] == 30


def test_step_counts_its_optimizer_steps(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    r = reporter(tmp_path)
    model = torch.nn.Linear(3, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = vramfit.Step(model, opt, attempt=vramfit.Attempt(micro_batch=2, grad_accum=2, global_batch=4),
                        total_steps=50, start_step=10)
    batch = (torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64))

    def loss(m: Any, b: Any) -> Any:
        return torch.nn.functional.mse_loss(m(b[0]), b[1])

    step.run(batch, loss)
    step.run(batch, loss)
    assert step.steps == 12
    assert (r.progress.steps, r.progress.total_steps) == (12, 50)


def test_lightning_callback_reports_global_steps_of_the_estimated_total(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import torch
    from test_adapters import Regression, attempt, dataset, quiet_trainer
    from vramfit.adapters import lightning as vl

    r = reporter(tmp_path)
    seen: List[Any] = []
    real = r.record_progress
    r.record_progress = lambda steps, total=None, **kw: seen.append((steps, total)) or real(steps, total, **kw)  # type: ignore[method-assign]
    current = attempt(4, 2, tmp_path)
    trainer = quiet_trainer(max_steps=3, callbacks=[vl.VramfitCallback(current)])
    trainer.fit(Regression(), torch.utils.data.DataLoader(dataset(), batch_size=4))
    assert seen[-1] == (3, 3)
    assert {total for _, total in seen} == {3}
    # Without max_steps the epochs give the total: 32 samples / 4 per batch / 2 accumulated, 2 epochs.
    seen.clear()
    trainer = quiet_trainer(max_epochs=2, callbacks=[vl.VramfitCallback(current)])
    trainer.fit(Regression(), torch.utils.data.DataLoader(dataset(), batch_size=4))
    assert seen[-1] == (8, 8)


def test_lightning_total_is_none_when_unbounded() -> None:
    pytest.importorskip("lightning")
    from vramfit.adapters.lightning import _total_steps

    class Unbounded:
        estimated_stepping_batches = float("inf")

    class Broken:
        @property
        def estimated_stepping_batches(self) -> int:
            raise RuntimeError("no length")

    assert _total_steps(Unbounded()) is None  # type: ignore[arg-type]
    assert _total_steps(Broken()) is None  # type: ignore[arg-type]


def test_hf_callback_reports_global_steps_of_max_steps(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from test_adapters import Rows, TinyLM, args, attempt
    from vramfit.adapters import huggingface as hf

    import transformers

    r = reporter(tmp_path)
    current = attempt(4, 1, tmp_path)
    kwargs = hf.training_args_kwargs(current)
    built = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True,
                                           max_steps=3, save_strategy="no", **kwargs)
    trainer = transformers.Trainer(model=TinyLM(), args=built, train_dataset=Rows(),
                                   callbacks=[hf.VramfitTrainerCallback(current)])
    hf.train(trainer)
    assert r.progress is not None and (r.progress.steps, r.progress.total_steps) == (3, 3)
    # From the epochs: 16 rows / 4 per step, 2 epochs.
    built = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True,
                                           num_train_epochs=2, save_strategy="no", **kwargs)
    trainer = transformers.Trainer(model=TinyLM(), args=built, train_dataset=Rows(),
                                   callbacks=[hf.VramfitTrainerCallback(current)])
    hf.train(trainer)
    assert (r.progress.steps, r.progress.total_steps) == (8, 8)
