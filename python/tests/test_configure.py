"""configure(): budget enforcement choice, the shape file, no-op outside vramfit."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import List

import pytest

import vramfit
from vramfit import state

MANAGED = {
    "VRAMFIT_MICRO_BATCH": "16",
    "VRAMFIT_GRAD_ACCUM": "4",
    "VRAMFIT_GLOBAL_BATCH": "64",
    "VRAMFIT_BUDGET_BYTES": str(10 * 2**30),
    "VRAMFIT_MEMORY_FRACTION": "0.070000",
    "VRAMFIT_ATTEMPT": "2",
}


def fake_allocator(monkeypatch: pytest.MonkeyPatch, available: bool) -> List[int]:
    calls: List[int] = []
    module = types.ModuleType("vramfit.allocator")

    def install(budget_bytes: int) -> bool:
        calls.append(budget_bytes)
        return available

    module.install = install  # type: ignore[attr-defined]
    module.is_budget_oom = lambda exc: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vramfit.allocator", module)
    monkeypatch.setattr(vramfit, "allocator", module, raising=False)
    return calls


def test_outside_vramfit_configure_changes_nothing(tmp_path: Path) -> None:
    attempt = vramfit.configure(micro_batch=8, grad_accum=2, env={})
    assert not attempt.managed
    assert (attempt.micro_batch, attempt.grad_accum, attempt.global_batch) == (8, 2, 16)
    assert attempt.enforcement == "none"
    assert state.shape_reporter() is None
    assert vramfit.current() == attempt


def test_the_allocator_enforces_the_budget_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_allocator(monkeypatch, available=True)
    attempt = vramfit.configure(micro_batch=128, env=MANAGED)
    assert calls == [10 * 2**30]
    assert attempt.enforcement == "allocator"
    assert (attempt.micro_batch, attempt.grad_accum) == (16, 4)



def test_the_allocator_gets_the_budget_less_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    # The budget covers the whole process on the GPU (the agent's NVML
    # watchdog measures it so); the CUDA context and libraries take their part.
    calls = fake_allocator(monkeypatch, available=True)
    env = dict(MANAGED, VRAMFIT_CONTEXT_BYTES=str(758 * 2**20))
    attempt = vramfit.configure(micro_batch=128, env=env)
    assert calls == [10 * 2**30 - 758 * 2**20]
    assert attempt.allocator_budget_bytes == 10 * 2**30 - 758 * 2**20
    assert attempt.enforcement == "allocator"


def test_a_context_as_large_as_the_budget_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_allocator(monkeypatch, available=True)
    env = dict(MANAGED, VRAMFIT_CONTEXT_BYTES=str(10 * 2**30))
    with pytest.raises(vramfit.ConfigError, match="leaves nothing"):
        vramfit.configure(env=env)

def test_native_opts_out_of_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_allocator(monkeypatch, available=True)
    attempt = vramfit.configure(env=dict(MANAGED, VRAMFIT_ALLOCATOR="native"))
    assert calls == []
    assert attempt.enforcement != "allocator"


def test_an_unavailable_allocator_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_allocator(monkeypatch, available=False)
    attempt = vramfit.configure(env=MANAGED)
    assert calls == [10 * 2**30]
    # Without a GPU there is nothing to limit; on one, the memory fraction applies.
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    assert attempt.enforcement == ("fraction" if gpu else "none")


def test_the_shape_file_is_published_atomically(tmp_path: Path) -> None:
    env = dict(MANAGED, VRAMFIT_STATS_DIR=str(tmp_path), VRAMFIT_ALLOCATOR="native")
    vramfit.configure(env=env)
    path = tmp_path / f"shape-{os.getpid()}.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["pid"] == os.getpid()
    assert (doc["microBatch"], doc["gradAccum"], doc["globalBatch"], doc["attempt"]) == (16, 4, 64, 2)
    assert doc["absorbedOoms"] == []
    reporter = state.shape_reporter()
    assert reporter is not None
    reporter.record_absorbed(16, 4, 8, 8)
    doc = json.loads(path.read_text())
    assert (doc["microBatch"], doc["gradAccum"]) == (8, 8)
    assert doc["absorbedOoms"][0]["fromMicro"] == 16 and doc["absorbedOoms"][0]["toAccum"] == 8
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "temporary files left behind"
    # The agent reads it as another user without CAP_DAC_OVERRIDE.
    assert path.stat().st_mode & 0o777 == 0o644


def test_the_shape_file_is_refreshed_for_the_agent(tmp_path: Path) -> None:
    from vramfit.shape import ShapeReporter

    reporter = ShapeReporter(
        str(tmp_path), micro_batch=4, grad_accum=2, global_batch=8, attempt=1, refresh_seconds=0.05
    )
    try:
        first = json.loads(Path(reporter.path).read_text())["updatedUnixMs"]
        import time

        time.sleep(0.3)
        later = json.loads(Path(reporter.path).read_text())["updatedUnixMs"]
        assert later > first
    finally:
        reporter.stop()


@pytest.mark.parametrize(
    "extra, devices, exits",
    [
        # Placed on a GPU, and the injection gave its device node.
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, ["nvidia0", "nvidiactl", "nvidia-uvm"], False),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"}, ["nvidia3"], False),
        # Placed on a GPU, and no device node: the injection did not run.
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, [], True),
        # The control devices alone are no GPU.
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, ["nvidiactl", "nvidia-uvm", "nvidia-caps"], True),
        # No GPU named: nothing to check.
        ({}, [], False),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, [], False),
        # The CPU-only profile phase, and the development node's simulated GPU.
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1", "VRAMFIT_PHASE": "profile"}, [], False),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-1", "VRAMFIT_SIMULATED_GPU": "GPU-1"}, [], False),
    ],
)
def test_a_container_without_its_gpu_exits_with_the_no_gpu_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict, devices: List[str], exits: bool
) -> None:
    fake_allocator(monkeypatch, available=True)
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in devices:
        (dev / name).touch()
    log = tmp_path / "termination-log"
    env = dict(MANAGED, VRAMFIT_TERMINATION_LOG=str(log), **extra)
    if not exits:
        assert vramfit.configure(env=env, dev=str(dev)).managed
        assert not log.exists()
        return
    with pytest.raises(SystemExit) as ended:
        vramfit.configure(env=env, dev=str(dev))
    assert ended.value.code == vramfit.NO_GPU_EXIT_CODE == 43
    text = log.read_text()
    assert text.startswith("vramfit: no GPU device"), text
    assert "GPU-1" in text


def test_outside_vramfit_a_missing_gpu_is_not_checked(tmp_path: Path) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}
    assert not vramfit.configure(micro_batch=8, grad_accum=1, env=env, dev=str(tmp_path)).managed
