"""CPU checks of the sharded-training calibration's configuration sets."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "calibrate_zero.py")

# The held-out split of the 4- and 8-GPU set, fixed before any measurement:
# changing it after results exist would fit on the held-out runs.
MULTI_HOLDOUT = {
    "z3-llama7b-s2048-b2-ampbf16-adamw-ckpt",
    "z2-llama3b-s2048-b4-bf16-adamw-ckpt",
    "z3-llama3b-s2048-b4-bf16-adamw",
    "z1-gpt2xl-s1024-b4-ampbf16-adamw",
    "z0-llama3b-s2048-b2-bf16-adamw-ckpt",
    "z3-llama7b-s4096-b1-bf16-adamw-ckpt",
}


def dry_run(*args):
    out = subprocess.run([sys.executable, SCRIPT, "--dry-run", *args], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("world", [4, 8])
def test_multi_gpu_set(world):
    lines = dry_run("--world", str(world))
    assert {c["name"] for c in lines if c["split"] == "holdout"} == MULTI_HOLDOUT
    assert len(lines) == 13
    for c in lines:
        spec = c["spec"]
        assert spec["gpus"] == world
        assert spec["batch"]["global"] == spec["batch"]["micro"] * world
    # Every stage is measured on both sides of the split.
    for split in ("fit", "holdout"):
        stages = {c["spec"]["model"]["zeroStage"] for c in lines if c["split"] == split}
        assert stages == {0, 1, 2, 3}, (split, stages)
    # 1-7B models: the range.
    sizes = {c["name"].split("-")[1] for c in lines}
    assert sizes == {"gpt2xl", "llama3b", "llama7b"}


def test_two_gpu_set_unchanged():
    lines = dry_run()
    assert len(lines) == 13
    assert all(c["spec"]["gpus"] == 2 for c in lines)
    assert sum(c["split"] == "holdout" for c in lines) == 6


def test_other_world_sizes_are_refused():
    r = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--world", "3"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "--world 3: 2, 4 or 8" in r.stderr
