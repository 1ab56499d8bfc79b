"""A run's ``metrics.jsonl`` read back as records, and maps from training steps to epochs and
minutes (validation lines carry only the step).

The trainer writes one JSON object per line: training lines hold ``step, epoch, loss, nll, ppl,
lr, tokens_per_s, elapsed`` (seconds), validation lines ``"split": "valid"``, ``step`` and the
validation metrics. Nothing here imports the model or the trainer: any file of that shape works.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from transduce.errors import UserError

__all__ = ["Record", "RunMetrics", "StepMap", "epoch_map", "minutes_map", "read_metrics", "series"]

Value = float | tuple[float, ...]


@dataclass(frozen=True)
class Record:
    """One line of ``metrics.jsonl``: its step and its numbers (lists of numbers as tuples).

    ``values`` holds every numeric field but ``step`` (``epoch`` and ``elapsed`` included) as
    floats; other fields (``split``) are dropped. ``line`` is the 1-based line in the file.
    """

    step: int
    values: Mapping[str, Value]
    line: int = 0

    def scalar(self, name: str) -> float | None:
        """The field ``name`` as a float, or None when absent or a list."""
        value = self.values.get(name)
        return value if isinstance(value, float) else None

    def vector(self, name: str) -> tuple[float, ...] | None:
        """The list field ``name`` (e.g. ``position_accuracy``), or None when absent or a number."""
        value = self.values.get(name)
        return value if isinstance(value, tuple) else None


class RunMetrics(NamedTuple):
    """A run's records, each split sorted by step (``train, valid = read_metrics(...)``)."""

    train: tuple[Record, ...]
    valid: tuple[Record, ...]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_line(text: str, lineno: int) -> tuple[object, Record | str]:
    """(the record's ``split``: None for a training line, the Record) or (None, what is wrong
    with the line)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg} at column {e.colno})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, found {type(obj).__name__}"
    step = obj.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None, f"expected a non-negative integer 'step', found {step!r}"
    values: dict[str, Value] = {}
    for key, value in obj.items():
        if key == "step":
            continue
        if _is_number(value):
            values[key] = float(value)
        elif isinstance(value, list) and all(_is_number(v) for v in value):
            values[key] = tuple(float(v) for v in value)
    return obj.get("split"), Record(step, MappingProxyType(values), lineno)


def _metrics_path(run_dir: Path) -> Path:
    if run_dir.is_file():
        return run_dir  # the metrics.jsonl file itself
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run folder")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(
            f"{path}: not found (a run folder holds the metrics.jsonl that training writes)"
        )
    return path


def read_metrics(run_dir: Path | str) -> RunMetrics:
    """The training and validation records of a run folder (or of a ``metrics.jsonl`` itself).

    Returns ``RunMetrics(train, valid)``, each sorted by step; a step logged twice (a resumed
    run redoing steps) keeps its later line. Lines of other splits (an update the divergence
    guard skipped, ``"skipped"``: one unapplied update's loss; a compile report) are left out.
    A last line that does not parse is skipped: a run still training may be writing it. Raises
    ``UserError`` for a missing folder or file, and for a bad line before the last one, naming
    the file, the line and what was expected.
    """
    path = _metrics_path(Path(run_dir))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read ({e})") from e
    numbered = [(i, text) for i, text in enumerate(lines, start=1) if text.strip()]
    by_split: tuple[dict[int, Record], dict[int, Record]] = ({}, {})
    for k, (lineno, text) in enumerate(numbered):
        split, parsed = _parse_line(text, lineno)
        if isinstance(parsed, str):
            if k == len(numbered) - 1:
                break  # half-written by a run still training
            raise UserError(f"{path}:{lineno}: {parsed}")
        if split is None or split == "valid":
            by_split[split == "valid"][parsed.step] = parsed
    train, valid = (tuple(d[s] for s in sorted(d)) for d in by_split)
    return RunMetrics(train, valid)


def series(records: Sequence[Record], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the records that hold the number ``name``: two float arrays (N,)."""
    pairs = [(r.step, v) for r in records if (v := r.scalar(name)) is not None]
    steps = np.array([p[0] for p in pairs], dtype=float)
    return steps, np.array([p[1] for p in pairs], dtype=float)


@dataclass(frozen=True)
class StepMap:
    """A piecewise-linear map from training steps to another axis (epochs, minutes), extended
    along its first and last segments past both ends. ``steps`` increase; ``values`` increase
    for ``inverse`` to be defined (epochs do)."""

    steps: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.steps) < 2 or len(self.steps) != len(self.values):
            raise ValueError("a StepMap needs at least two (step, value) anchors")

    def __call__(self, steps: ArrayLike) -> np.ndarray:
        """The values at ``steps`` (any shape; the same shape back, as floats)."""
        return _extended_interp(np.asarray(steps, dtype=float), self.steps, self.values)

    def inverse(self, values: ArrayLike) -> np.ndarray:
        """The steps at ``values`` (any shape; the same shape back, as floats)."""
        return _extended_interp(np.asarray(values, dtype=float), self.values, self.steps)


def _extended_interp(x: np.ndarray, xp: Sequence[float], fp: Sequence[float]) -> np.ndarray:
    """``np.interp``, but linear past the ends instead of flat (a secondary axis must invert)."""
    xa, fa = np.asarray(xp, dtype=float), np.asarray(fp, dtype=float)
    y = np.interp(x, xa, fa)
    lo_slope = (fa[1] - fa[0]) / max(xa[1] - xa[0], 1e-12)
    hi_slope = (fa[-1] - fa[-2]) / max(xa[-1] - xa[-2], 1e-12)
    y = np.where(x < xa[0], fa[0] + (x - xa[0]) * lo_slope, y)
    return np.where(x > xa[-1], fa[-1] + (x - xa[-1]) * hi_slope, y)


def epoch_map(train: Sequence[Record]) -> StepMap | None:
    """Steps -> epochs of training done (fractional), from the training records' ``epoch``.

    Epoch ``e`` (0-based, as logged) starts at step 0 for ``e = 0``, and otherwise midway between
    the last step logged in the epoch before and the first step logged in ``e`` (the true start
    lies between them, so the error is at most half the logging interval). Within an epoch the
    map is linear; past the last start it continues at the last epoch's pace. None when the
    records show no epoch start beyond step 0 (no pace to go by).
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for r in train:
        e = r.scalar("epoch")
        if e is None or not math.isfinite(e):
            continue
        first.setdefault(int(e), r.step)
        last[int(e)] = r.step
    epochs = sorted(first)
    anchors = [(0.0, 0.0)] if epochs and epochs[0] == 0 else []
    for before, e in itertools.pairwise(epochs):
        anchors.append(((last[before] + first[e]) / 2, float(e)))
    if len(anchors) < 2:
        return None
    return StepMap(tuple(a[0] for a in anchors), tuple(a[1] for a in anchors))


def minutes_map(train: Sequence[Record]) -> StepMap | None:
    """Steps -> minutes of training (the records' ``elapsed`` seconds / 60), from step 0 at 0.

    None when no training record holds ``elapsed``.
    """
    steps, seconds = series(train, "elapsed")
    if not len(steps):
        return None
    if steps[0] > 0:  # the clock starts with training, at step 0
        steps, seconds = np.concatenate([[0.0], steps]), np.concatenate([[0.0], seconds])
    if len(steps) < 2:
        return None
    return StepMap(tuple(steps.tolist()), tuple((seconds / 60).tolist()))
