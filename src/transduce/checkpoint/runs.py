"""A run's checkpoints: the ``step_N.pt`` files, the last K kept (``prune``), and their
average (section 6.1)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from transduce.checkpoint.models import _parts, check_finite, read_model_file
from transduce.errors import UserError

_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def step_checkpoints(directory: str | Path) -> list[Path]:
    """``step_N.pt`` files in ``directory``, oldest step first."""
    return [p for _, p in _numbered(directory)]


def _numbered(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the ``step_N.pt`` files in ``directory``, oldest step first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_FILE.match(p.name)))


def step_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def prune(
    directory: str | Path, keep_last: int, save_every: int = 0, scheduled_after: int = 0
) -> None:
    """Delete all but the newest ``keep_last`` step checkpoints (all of them when it is 0).
    With ``save_every``, first those off its schedule (a step not a multiple of it: written for
    a stop signal) unless newest, so that a preempted and resumed run keeps, and averages, the
    checkpoints an uninterrupted one would; only those after step ``scheduled_after`` (a run
    resumed there with another ``save_every``: the earlier ones kept its own schedule)."""
    if save_every > 0:
        for step, p in _numbered(directory)[:-1]:
            if step > scheduled_after and step % save_every:
                p.unlink(missing_ok=True)
    found = step_checkpoints(directory)
    for p in found[: max(len(found) - keep_last, 0)]:
        p.unlink(missing_ok=True)


def average(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The element-wise mean of the models in ``paths`` (floating tensors; others from the last).

    Returns a model checkpoint (config, vocab, model) with the newest one's config and vocab.
    Sums are kept in float64 so averaging 20 checkpoints (the paper's big model) loses nothing.
    """
    if isinstance(paths, str | Path):  # a str is a Sequence of characters
        raise UserError(f"average takes a list of checkpoints, not one: {paths}")
    if not paths:
        raise UserError("no checkpoints to average")
    sums: dict[str, torch.Tensor] = {}
    last: dict[str, Any] = {}
    first: dict[str, Any] = {}
    keys: set[str] | None = None
    for p in paths:
        last = read_model_file(p)  # a checkpoint, a model file, or its .safetensors
        if not isinstance(last["model"], dict) or not all(
            isinstance(v, torch.Tensor) for v in last["model"].values()
        ):
            raise UserError(f"{p}: its model is not a mapping of names to tensors")
        _parts(Path(p), last)  # a damaged config or vocabulary: one line naming the file
        check_finite(p, last["model"])
        if keys is None:
            keys, first = set(last["model"]), last
        elif set(last["model"]) != keys:
            raise UserError(f"{p}: holds different parameters from {paths[0]}")
        else:
            _check_same_model(p, last, first, paths[0])
        for k, v in last["model"].items():
            if k in sums and v.shape != sums[k].shape:
                raise UserError(
                    f"{p}: {k} has shape {tuple(v.shape)}, "
                    f"not {tuple(sums[k].shape)} as in {paths[0]}"
                )
            if v.is_floating_point():
                sums[k] = sums[k] + v.double() if k in sums else v.double()
    model = {
        k: (sums[k] / len(paths)).to(v.dtype) if k in sums else v for k, v in last["model"].items()
    }
    out: dict[str, Any] = {key: last[key] for key in ("config", "vocab") if key in last}
    out["model"] = model
    out["averaged"] = [str(p) for p in paths]
    return out


def _check_same_model(
    path: str | Path, data: dict[str, Any], first: dict[str, Any], first_path: str | Path
) -> None:
    """A UserError unless checkpoint ``data`` has the model architecture and vocabulary of
    ``first``: tensors of equal shapes from models of other vocabularies (or of another norm or
    activation) would average into nonsense in silence."""
    if data.get("vocab") != first.get("vocab"):
        raise UserError(
            f"{path}: its vocabulary is not that of {first_path}; average checkpoints of one run"
        )
    model, first_model = (d.get("config", {}).get("model") for d in (data, first))
    if model != first_model:
        keys = sorted(set(model or {}) | set(first_model or {}))
        differ = [k for k in keys if (model or {}).get(k) != (first_model or {}).get(k)]
        raise UserError(
            f"{path}: its model config differs from {first_path}'s "
            f"({', '.join(differ) or 'model'}); average checkpoints of one run"
        )
    task, first_task = (d.get("config", {}).get("task") or {} for d in (data, first))
    for key, default in (("name", None), ("reverse_input", False)):  # what the model reads
        # (configs stored before the task section was split hold reverse_input for every task)
        this, that = task.get(key, default), first_task.get(key, default)
        if this != that:
            raise UserError(
                f"{path}: its task differs from {first_path}'s (task.{key}: {this!r}, not "
                f"{that!r}); average checkpoints of one run"
            )


def last_checkpoints(run_dir: str | Path, last: int) -> list[Path]:
    """The newest ``last`` step checkpoints of a run folder; a UserError when there are none."""
    if last <= 0:
        raise UserError(f"--last must be positive; got {last}")
    found = step_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        raise UserError(f"no checkpoints/step_*.pt in run folder {run_dir}")
    return found[-last:]
