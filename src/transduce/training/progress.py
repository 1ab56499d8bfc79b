"""Where a run stands (saved in every checkpoint) and the rules that stop it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from transduce.config import TrainConfig
from transduce.training import distributed


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    step: int = 0  # optimizer updates done
    epoch: int = 0  # current epoch (0-based)
    batch_index: int = 0  # next batch of this rank's share of the current epoch
    elapsed: float = 0.0  # seconds of training so far, across resumes
    best_score: float = -math.inf
    bad_evals: int = 0  # validations since the best one (early stopping)
    last_valid_step: int = -1  # step of the latest validation
    skipped_updates: int = 0  # updates skipped for a non-finite loss or gradient norm, in all
    bad_in_row: int = 0  # of them, the latest ones in a row (training/guard.py)


def budget_spent(p: Progress, t: TrainConfig, minutes: float) -> float:
    """The share of the budget spent, the cool-down's clock: the largest of steps, epochs and
    ``minutes`` of training over their limits, at most 1."""
    done = [p.step / t.max_steps]
    if t.max_epochs:
        done.append(p.epoch / t.max_epochs)
    if t.max_minutes:
        done.append(minutes / t.max_minutes)
    return min(max(done), 1.0)


def after_validation(
    p: Progress, t: TrainConfig, metrics: Mapping[str, Any], score_key: str
) -> tuple[str | None, bool]:
    """Count a validation's ``metrics`` in ``p``: (why to stop now, ``early_stopping`` or
    ``target_seq_accuracy``, or None; whether its ``score_key`` is the best so far)."""
    score = metrics.get(score_key, -math.inf)
    best = score > p.best_score
    if best:
        p.best_score, p.bad_evals = score, 0
    else:
        p.bad_evals += 1
    if t.patience and p.bad_evals >= t.patience:
        return "early_stopping", best
    if t.target_seq_accuracy and metrics.get("seq_accuracy", 0.0) >= t.target_seq_accuracy:
        return "target_seq_accuracy", best
    return None, best


def stop_reason(p: Progress, t: TrainConfig, minutes: float) -> str | None:
    """Why a run stops now (``max_steps``, ``max_epochs``, ``max_minutes``), or None."""
    if p.step >= t.max_steps:
        return "max_steps"
    if t.max_epochs and p.epoch >= t.max_epochs:
        return "max_epochs"
    if t.max_minutes and minutes >= t.max_minutes:
        return "max_minutes"
    return None


def should_stop(
    p: Progress, t: TrainConfig, elapsed: float, world: distributed.World, device: torch.device
) -> tuple[str | None, float]:
    """(why to stop now, or None; the share of the budget spent) after ``elapsed`` seconds of
    training on this rank. Clocks differ between ranks: all use the mean, so that all stop
    together and take the same learning rate (every rank must call it)."""
    minutes = training_minutes(t, elapsed, world, device)
    return stop_reason(p, t, minutes), budget_spent(p, t, minutes)


def training_minutes(
    t: TrainConfig, elapsed: float, world: distributed.World, device: torch.device
) -> float:
    """Minutes of training for the budget: the mean of the ranks' ``elapsed`` seconds (every
    rank must call it), 0 without ``max_minutes``."""
    if not t.max_minutes:
        return 0.0
    (total,) = distributed.all_reduce_sum([elapsed], world, device)
    return total / world.size / 60


__all__ = [
    "Progress",
    "after_validation",
    "budget_spent",
    "should_stop",
    "stop_reason",
    "training_minutes",
]
