"""From a Config to a trained run folder: ``train`` hands the config to its task's module.

The tasks (``training/tasks/``): a synthetic task (``train_synthetic``), ``translation``
(``train_translation``: from parallel text files or a prepared folder) and ``parsing``
(``train_parsing``). Each reads its data and trains on the shared ``training.fit.fit``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from transduce.config import (
    Config,
    ParsingTaskConfig,
    SyntheticTaskConfig,
    TaskConfig,
    TranslationTaskConfig,
)
from transduce.device import resolve_device
from transduce.errors import UserError
from transduce.training.compiling import check_mode
from transduce.training.config_change import allowed_keys
from transduce.training.precision import check_precision
from transduce.training.tasks.parsing import train_parsing
from transduce.training.tasks.synthetic import train_synthetic
from transduce.training.tasks.translation import train_translation
from transduce.training.trainer import StepCallback


class TrainTask(Protocol):
    """How every task trains: the config, the run folder, and how the run goes."""

    def __call__(
        self,
        cfg: Config,
        out_dir: str | Path,
        *,
        resume: bool = False,
        show_progress: bool | None = None,
        callbacks: Sequence[StepCallback] = (),
        allow_change: Sequence[str] = (),
    ) -> dict[str, Any]: ...


# The config's task (its section's class) -> the function that trains it
TASKS: dict[type[TaskConfig], TrainTask] = {
    SyntheticTaskConfig: train_synthetic,
    TranslationTaskConfig: train_translation,
    ParsingTaskConfig: train_parsing,
}


def _check_same_task(cfg: Config, out_dir: Path) -> None:
    """A UserError when the run in ``out_dir`` (its config.json) is of another task than
    ``cfg``: before this task learns a vocabulary into the folder (the checkpoint's own check,
    later, names every key that differs)."""
    try:
        written = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
        name = written["task"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no run there yet, or a damaged one: the resume itself says what it finds
    if name != cfg.task.name:
        raise UserError(
            f"{out_dir} holds a run of task {name}, not {cfg.task.name}: resume it with its own "
            "config, or start this run in another folder"
        )


def train(
    cfg: Config,
    out_dir: str | Path,
    *,
    resume: bool = False,
    show_progress: bool | None = None,
    callbacks: Sequence[StepCallback] = (),
    allow_change: Sequence[str] = (),
) -> dict[str, Any]:
    """Train whatever ``cfg.task`` names (``TASKS``). ``callbacks`` are called with the run's
    progress after every update. ``allow_change``: with ``resume``, config keys that may differ
    from the run's beyond those free to (``training/config_change.py``); checked here, before
    any data is read."""
    if not isinstance(cfg, Config):  # a dict, a YAML file's name: not yet a Config
        raise TypeError(
            f"cfg must be a Config (transduce.config.from_dict or load_config makes one), not "
            f"{type(cfg).__name__}"
        )
    allowed_keys(allow_change)  # a UserError naming a key that does not exist
    if allow_change and not resume:
        raise UserError("allow_change (--allow-change) applies only when resuming (--resume)")
    if cfg.train.compile:  # before a vocabulary is learned or a run folder written
        check_mode(cfg.train.compile, resolve_device(cfg.train.device))
    check_precision(cfg.train.precision, cfg.model.architecture, cfg.train.device)  # as well
    if resume:
        _check_same_task(cfg, Path(out_dir))
    return TASKS[type(cfg.task)](
        cfg,
        out_dir,
        resume=resume,
        show_progress=show_progress,
        callbacks=callbacks,
        allow_change=allow_change,
    )


__all__ = ["TASKS", "TrainTask", "train", "train_parsing", "train_synthetic", "train_translation"]
