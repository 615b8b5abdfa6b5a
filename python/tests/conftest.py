"""Shared fixtures: every test starts without a configured attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from vramfit import state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(__import__("os").environ):
        if name.startswith("VRAMFIT_") or name in ("WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name, raising=False)
    state.set_attempt(None)
    state.set_shape_reporter(None)
    yield
    state.set_attempt(None)
    state.set_shape_reporter(None)
