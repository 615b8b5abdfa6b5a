"""Reading the attempt's variables, and the values a script gets outside vramfit."""

from __future__ import annotations

import pytest

from vramfit.attempt import ConfigError, from_env

MANAGED = {
    "VRAMFIT_MICRO_BATCH": "16",
    "VRAMFIT_GRAD_ACCUM": "4",
    "VRAMFIT_GLOBAL_BATCH": "64",
    "VRAMFIT_MIN_MICRO_BATCH": "2",
    "VRAMFIT_ATTEMPT": "3",
    "VRAMFIT_BUDGET_BYTES": "21474836480",
    "VRAMFIT_MEMORY_FRACTION": "0.140000",
    "VRAMFIT_OOM_EXIT_CODE": "42",
    "VRAMFIT_STATS_DIR": "/run/vramfit",
}


def test_variables_win_over_the_scripts_values() -> None:
    attempt = from_env(MANAGED, micro_batch=128, grad_accum=1)
    assert attempt.managed
    assert (attempt.micro_batch, attempt.grad_accum, attempt.global_batch) == (16, 4, 64)
    assert attempt.min_micro_batch == 2 and attempt.attempt == 3
    assert attempt.budget_bytes == 20 * 2**30
    assert attempt.memory_fraction == pytest.approx(0.14)
    assert attempt.stats_dir == "/run/vramfit"
    assert attempt.termination_log == "/dev/termination-log"
    assert attempt.rank_batch == 64


def test_outside_vramfit_the_scripts_values_come_back() -> None:
    attempt = from_env({}, micro_batch=8, grad_accum=4)
    assert not attempt.managed
    assert (attempt.micro_batch, attempt.grad_accum, attempt.global_batch) == (8, 4, 32)
    assert from_env({}, micro_batch=8, global_batch=64).grad_accum == 8
    assert from_env({}, global_batch=64, grad_accum=2).micro_batch == 32
    assert from_env({"WORLD_SIZE": "2"}, micro_batch=8, global_batch=64).grad_accum == 4
    assert attempt.budget_bytes is None and attempt.enforcement == "none"


def test_a_shape_that_does_not_multiply_out_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not VRAMFIT_GLOBAL_BATCH 60"):
        from_env(dict(MANAGED, VRAMFIT_GLOBAL_BATCH="60"))
    with pytest.raises(ConfigError, match="not global_batch 60"):
        from_env({}, micro_batch=8, grad_accum=4, global_batch=60)
    with pytest.raises(ConfigError, match="needs micro_batch or global_batch"):
        from_env({})


def test_bad_variables_are_named() -> None:
    with pytest.raises(ConfigError, match="VRAMFIT_MICRO_BATCH='x'"):
        from_env(dict(MANAGED, VRAMFIT_MICRO_BATCH="x"))
    with pytest.raises(ConfigError, match="VRAMFIT_MEMORY_FRACTION=1.5"):
        from_env(dict(MANAGED, VRAMFIT_MEMORY_FRACTION="1.5"))
    with pytest.raises(ConfigError, match="VRAMFIT_GRAD_ACCUM=0"):
        from_env(dict(MANAGED, VRAMFIT_GRAD_ACCUM="0"))


def test_termination_log_path_is_configurable() -> None:
    assert from_env(dict(MANAGED, VRAMFIT_TERMINATION_LOG="/tmp/t")).termination_log == "/tmp/t"
    assert from_env(MANAGED, termination_log="/tmp/u").termination_log == "/tmp/u"
