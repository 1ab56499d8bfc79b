"""Run folders for the plotting tests (helpers in plot_helpers.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from plot_helpers import run_records, write_run


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """``make_run(name, tail="", **run_records options)``: a run folder under tmp_path."""

    def make(name: str, tail: str = "", **options: object) -> Path:
        return write_run(tmp_path / name, run_records(**options), tail)  # type: ignore[arg-type]

    return make
