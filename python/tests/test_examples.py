"""The example scripts run end to end on the CPU (tiny shapes), outside and under vramfit."""

from __future__ import annotations

import json
from pathlib import Path

import torch  # noqa: F401  (the examples need it)
import transformers  # noqa: F401

from test_oom import run_script


def run_example(module: str, args: list, tmp_path: Path, env: dict = None) -> list:
    events = tmp_path / "events.jsonl"
    code = f"import sys, runpy; sys.argv = {[module] + args + ['--events', str(events)]!r}; runpy.run_module({module!r}, run_name='__main__')"
    out = run_script(code, env)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in events.read_text().splitlines()]


def test_causal_lm_example_trains_from_a_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                                  "vocab_size": 100, "max_position_embeddings": 16}))
    events = run_example("vramfit.examples.causal_lm",
                         ["--config", str(config), "--steps", "2", "--micro", "2", "--global-batch", "4",
                          "--eval-samples", "2"], tmp_path)
    assert [e["event"] for e in events] == ["ready", "step", "step", "done"]
    assert events[0]["micro"] == 2 and events[0]["accum"] == 2
    assert events[-1]["eval_loss"] > 0


def test_mlp_example_takes_the_attempts_shape_under_vramfit(tmp_path: Path) -> None:
    env = {"VRAMFIT_MICRO_BATCH": "4", "VRAMFIT_GRAD_ACCUM": "2", "VRAMFIT_GLOBAL_BATCH": "8",
           "VRAMFIT_STATS_DIR": str(tmp_path / "stats"), "VRAMFIT_TERMINATION_LOG": str(tmp_path / "t")}
    events = run_example("vramfit.examples.mlp",
                         ["--layers", "2", "--hidden", "16", "--steps", "2", "--optimizer", "sgd-momentum",
                          "--absorb"], tmp_path, env)
    ready = events[0]
    assert (ready["micro"], ready["accum"], ready["global_batch"]) == (4, 2, 8)
    assert len(list((tmp_path / "stats").glob("shape-*.json"))) == 1
