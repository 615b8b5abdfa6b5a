"""The Python back-off makes the Rust controller's decisions (one table for both)."""

from __future__ import annotations

import json

from conftest import REPO

from vramfit.backoff import BatchShape, Fail, Retry, after_oom


def load_cases() -> list:
    return json.loads((REPO / "tests/data/backoff-cases.json").read_text())["cases"]


def test_backoff_matches_the_shared_table() -> None:
    cases = load_cases()
    assert len(cases) >= 10
    for case in cases:
        got = after_oom(
            case["global"],
            case["gpus"],
            BatchShape(*case["current"]),
            case["minMicro"],
            case["used"],
            case["max"],
        )
        if "retry" in case:
            assert got == Retry(BatchShape(*case["retry"])), case
            assert got.shape.micro * got.shape.accum * case["gpus"] == case["global"]
        else:
            assert isinstance(got, Fail), (case, got)
            for words in case["fail"]:
                assert words in got.reason, (case, got.reason)


def test_batch_shape_requires_an_exact_division() -> None:
    assert BatchShape.for_micro(64, 8, 1) == BatchShape(8, 8)
    assert BatchShape.for_micro(60, 8, 1) is None
    assert BatchShape.for_micro(64, 0, 1) is None
    assert BatchShape(8, 8).display() == "8x8"
