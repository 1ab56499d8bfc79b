"""A new run in a folder that holds a run is refused before it touches anything: it would mix
with the old run's checkpoints (its model.pt an average of theirs, its own last checkpoint
pruned) and overwrite the old metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_testkit import TINY

from transduce.config import from_dict, update
from transduce.errors import UserError
from transduce.training.run import train


def test_a_second_run_in_a_run_folder_is_refused(tmp_path: Path) -> None:
    cfg = update(from_dict(TINY), {"max_steps": 4, "save_every": 2})
    train(cfg, tmp_path, show_progress=False)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="already holds a run.*--resume continues it"):
        train(update(cfg, {"seed": 7, "max_steps": 3}), tmp_path, show_progress=False)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    summary = train(update(cfg, {"max_steps": 6}), tmp_path, resume=True, show_progress=False)
    assert summary["step"] == 6


def test_the_demo_twice_in_one_folder_is_refused(tmp_path: Path) -> None:
    from transduce.demo import run_demo

    small = {"n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8}
    overrides = {**small, "max_steps": 2, "save_every": 2, "eval_every": 0}
    run_demo(tmp_path, overrides, show_progress=False)
    with pytest.raises(UserError, match="already holds a run"):
        run_demo(tmp_path, overrides, show_progress=False)
