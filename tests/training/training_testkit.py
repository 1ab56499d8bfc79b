"""Tiny runs for the tests of a run's protections (guard, preemption, config change, full disk):
a copy task that trains a step in milliseconds, run through the command line in this process,
with step callbacks slipped into it."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from transduce.cli.main import main
from transduce.config import Config, update
from transduce.data.synthetic import make_task
from transduce.model.transformer import make_model
from transduce.training import run
from transduce.training.progress import Progress
from transduce.training.tasks.synthetic import encode_pairs
from transduce.training.trainer import Trainer

TINY: dict[str, Any] = {
    "model": {
        "n_layers": 1,
        "d_model": 16,
        "d_ff": 32,
        "n_heads": 2,
        "d_k": 8,
        "d_v": 8,
        "dropout": 0.1,
    },
    "train": {
        "max_tokens": 128,
        "warmup": 10,
        "max_steps": 8,
        "save_every": 4,
        "log_every": 1,
        "eval_every": 0,
        "keep_last": 5,
        "tensorboard": False,
    },
    "task": {"name": "copy", "train_size": 200, "valid_size": 8, "max_length": 5, "n_symbols": 5},
    "decode": {"beam": 1},
}


def write_config(path: Path, **train: Any) -> Path:
    """TINY, its train section updated with ``train``, as a YAML file at ``path``."""
    config = {section: dict(keys) for section, keys in TINY.items()}
    config["train"].update(train)
    path.write_text(yaml.safe_dump(config))
    return path


def tiny_trainer(
    run_dir: Path,
    *,
    valid: bool = False,
    resume: bool = False,
    callbacks: tuple[Callable[[Progress], None], ...] = (),
    **train: Any,
) -> Trainer:
    """A Trainer of TINY, its keys updated with ``train``, silent; ``valid``: with the task's
    validation pairs (validations at ``eval_every``)."""
    flat = {k: v for section in TINY.values() for k, v in section.items()}
    cfg = update(Config(), {**flat, **train})
    task = make_task(cfg.task)
    torch.manual_seed(cfg.train.seed)
    model = make_model(cfg.model, src_vocab_size=len(task.vocab))
    return Trainer(
        cfg,
        model,
        task.vocab,
        encode_pairs(task.vocab, task.train),
        run_dir=run_dir,
        valid_pairs=encode_pairs(task.vocab, task.valid) if valid else (),
        resume=resume,
        callbacks=callbacks,
        show_progress=False,
    )


def _no_bare_constants(name: str) -> Any:
    raise AssertionError(f"metrics.jsonl holds a bare {name}, which is not JSON")


def records(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records; a bare NaN or Infinity in it fails the test."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=_no_bare_constants) for line in lines]


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(run_dir) if "split" not in r]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``transduce ARGV`` in this process: (exit code, stderr)."""
    code = main(["--no-malloc-tuning", *argv])
    return code, capsys.readouterr().err


def train_args(config: Path, out: Path, *more: str) -> list[str]:
    return ["train", "--config", str(config), "--out", str(out), "--quiet", *more]


def with_callbacks(monkeypatch: pytest.MonkeyPatch, *callbacks: Callable[[Progress], None]) -> None:
    """Runs that ``transduce train`` starts from now on call ``callbacks`` after every update."""
    monkeypatch.setattr(run, "train", functools.partial(run.train, callbacks=callbacks))


def at_step(step: int, action: Callable[[], object]) -> Callable[[Progress], None]:
    """A step callback doing ``action`` once, when the run has made ``step`` updates."""
    done: list[bool] = []

    def callback(p: Progress) -> None:
        if p.step == step and not done:
            done.append(True)
            action()

    return callback


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def finite(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)
