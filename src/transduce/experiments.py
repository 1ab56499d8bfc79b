"""Experiments that train several runs and draw what they show.

``reversal``: does feeding the source reversed help a Transformer, as it helped the LSTMs of
Sutskever et al. (2014)? A synthetic task trained twice on the same split with the same seed and
budget, once as is and once with every source reversed (``task.reverse_input``); the two runs
differ only in the order of the input. Writes both run folders, ``reversal.png`` (accuracy,
accuracy per answer position and loss against steps, one row per run) and ``summary.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from transduce.checkpoint import step_checkpoints
from transduce.config import Config, from_dict, update
from transduce.demo import DEMO_CONFIG
from transduce.plotting.records import read_metrics
from transduce.plotting.reversal import plot_reversal, reversal_summary
from transduce.training.fit import check_new_run, check_resumable
from transduce.training.run import train_synthetic

SyntheticTask = Literal["addition", "copy", "reverse"]


def reversal_config(task: SyntheticTask, minutes: float, reverse_input: bool) -> Config:
    """The demo's model and recipe on ``task`` for ``minutes``, validated every 100 steps (the
    curves' resolution) and not stopped early: both runs get the same budget."""
    cfg = from_dict(DEMO_CONFIG, source="demo config")
    changes: dict[str, Any] = {
        "name": task,
        "reverse_input": reverse_input,
        "max_minutes": minutes,
        "target_seq_accuracy": 0.0,
        "eval_every": 100,
        "save_every": 100_000,
        "max_steps": 100_000,
        "tensorboard": False,
    }
    if task != "addition":  # sequences of 1-10 symbols of 10
        changes.update(train_size=50_000, max_length=10)
    return update(cfg, changes)


def reversal(
    out: str | Path,
    *,
    task: SyntheticTask = "addition",
    minutes: float = 2.5,
    resume: bool = False,
    show_progress: bool | None = None,
) -> dict[str, Any]:
    """Train ``task`` as is (``out/baseline``) and with reversed input (``out/reversed``) for
    ``minutes`` each; draw ``out/reversal.png`` and write ``out/summary.json``, which it returns:
    per run the final sequence and token accuracy, steps and seconds to 99% sequence accuracy
    (None if never), and where the figure is. ``resume``: continue a stopped experiment in
    ``out``, each run where it stopped (a finished one, with its model.pt, kept as it is)."""
    out = Path(out)
    runs = {"baseline": out / "baseline", "reversed": out / "reversed"}
    todo: dict[str, bool] = {}  # run -> resume it (False: a new run)
    for name, run in runs.items():  # both, before either trains
        if resume and (run / "model.pt").is_file():
            continue  # finished before the stop
        todo[name] = resume and bool(step_checkpoints(run / "checkpoints"))
        check_new_run(run, todo[name])
    if resume and not any(todo.values()) and len(todo) == len(runs):
        check_resumable(runs["baseline"])  # nothing of this experiment there: a misspelt --out?
    for name, again in todo.items():
        cfg = reversal_config(task, minutes, reverse_input=name == "reversed")
        train_synthetic(cfg, runs[name], resume=again, show_progress=show_progress)
    figure = plot_reversal(runs["baseline"], runs["reversed"], out / "reversal.png")
    summary: dict[str, Any] = {"task": task, "minutes_per_run": minutes, "figure": str(figure)}
    for name, run in runs.items():
        summary[name] = reversal_summary(read_metrics(run))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


__all__ = ["reversal", "reversal_config"]
