"""A new run in a folder that holds a run is refused before it touches anything: it would mix
with the old run's checkpoints (its model.pt an average of theirs, its own last checkpoint
pruned) and overwrite the old metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from transduce.config import Config, update
from transduce.errors import UserError
from transduce.training.run import train

TINY = {
    "n_layers": 1,
    "d_model": 16,
    "d_ff": 32,
    "n_heads": 2,
    "d_k": 8,
    "d_v": 8,
    "max_steps": 4,
    "save_every": 2,
    "eval_every": 0,
    "tensorboard": False,
    "name": "copy",
    "train_size": 40,
    "valid_size": 8,
    "max_length": 4,
}


def test_a_second_run_in_a_run_folder_is_refused(tmp_path: Path) -> None:
    cfg = update(Config(), TINY)
    train(cfg, tmp_path, show_progress=False)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="already holds a run.*--resume continues it"):
        train(update(cfg, {"seed": 7, "max_steps": 3}), tmp_path, show_progress=False)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    summary = train(update(cfg, {"max_steps": 6}), tmp_path, resume=True, show_progress=False)
    assert summary["step"] == 6
