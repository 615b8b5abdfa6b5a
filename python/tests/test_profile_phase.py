"""The automatic-profiling protocol (VRAMFIT_PHASE=profile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

torch = pytest.importorskip("torch")

from vramfit import profile  # noqa: E402

HERE = Path(__file__).resolve().parent


def run_script(name: str, tmp_path: Path, micro: int = 2, **env: str) -> subprocess.CompletedProcess:
    log = tmp_path / "termination-log"
    log.write_text("")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VRAMFIT_")}
    environ.update({
        "VRAMFIT_PHASE": "profile", "VRAMFIT_MICRO_BATCH": str(micro), "VRAMFIT_GRAD_ACCUM": "1",
        "VRAMFIT_GLOBAL_BATCH": str(micro), "VRAMFIT_TERMINATION_LOG": str(log),
        "VRAMFIT_PROFILE_OUT": str(tmp_path / "profile.json"), "PROFILE_SCRIPT_OUT": str(tmp_path / "out"),
        "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}", "CUDA_VISIBLE_DEVICES": "",
    })
    environ.update(env)
    return subprocess.run([sys.executable, "-c", f"import profile_scripts; profile_scripts.{name}()"],
                          capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=120)


def profile_lines(stdout: str) -> List[str]:
    return [line for line in stdout.splitlines() if line.startswith("vramfit-profile")]


def check_profile(r: subprocess.CompletedProcess, tmp_path: Path, micro: int) -> Dict:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trained" not in r.stdout
    lines = profile_lines(r.stdout)
    assert len(lines) == 1 and lines[0].startswith(profile.PROFILE_PREFIX)
    p = profile.decode_profile_line(lines[0])
    assert p["format"] == profile.FORMAT and p["microBatch"] == micro and p["events"]
    assert json.loads((tmp_path / "profile.json").read_text()) == p
    if len(lines[0]) <= profile.TERMINATION_LINE_MAX:
        assert (tmp_path / "termination-log").read_text() == lines[0]
    return p


def test_step_profiles_the_real_step_and_exits(tmp_path: Path) -> None:
    p = check_profile(run_script("step", tmp_path, micro=2), tmp_path, micro=2)
    assert p["capture"]["api"] == "capture_step" and p["capture"]["model"] == "vramfit.Step"
    # the AdamW state of the 16x64 weight exists: the optimizer stepped
    assert [p["sizes"][e] for e in p["events"] if e >= 0].count(16 * 64 * 4) >= 4


def test_a_failed_capture_reports_one_line_and_exits_3(tmp_path: Path) -> None:
    r = run_script("step", tmp_path, PROFILE_SCRIPT_FAIL="1")
    assert r.returncode == profile.ERROR_EXIT_CODE, r.stdout + r.stderr
    lines = profile_lines(r.stdout)
    assert len(lines) == 1 and lines[0].startswith(profile.ERROR_PREFIX)
    assert (tmp_path / "termination-log").read_text() == lines[0]
    assert "trained" not in r.stdout and not (tmp_path / "profile.json").exists()


def test_lightning_callback_profiles_the_fit_loop(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    check_profile(run_script("lightning", tmp_path, micro=2), tmp_path, micro=2)


def test_hf_trainer_profiles_its_own_steps(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    p = check_profile(run_script("huggingface", tmp_path, micro=2), tmp_path, micro=2)
    assert p["capture"]["model"] == "transformers.Trainer GPT2LMHeadModel"


def test_the_profile_line_round_trips_and_is_one_base64_line() -> None:
    prof = {"format": profile.FORMAT, "microBatch": 3, "sizes": [4], "events": [0, -1]}
    line = profile.profile_line(prof)
    payload = line[len(profile.PROFILE_PREFIX):]
    assert "\n" not in line and all(c.isalnum() or c in "+/=" for c in payload)
    assert profile.decode_profile_line(line) == prof
