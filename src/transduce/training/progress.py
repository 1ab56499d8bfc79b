"""Where a run stands (saved in every checkpoint) and the rules that stop it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from transduce.config import TrainConfig


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


def budget_spent(p: Progress, t: TrainConfig, minutes: float) -> float:
    """The share of the budget spent, the cool-down's clock: the largest of steps, epochs and
    ``minutes`` of training over their limits, at most 1."""
    done = [p.step / t.max_steps]
    if t.max_epochs:
        done.append(p.epoch / t.max_epochs)
    if t.max_minutes:
        done.append(minutes / t.max_minutes)
    return min(max(done), 1.0)


def stop_reason(p: Progress, t: TrainConfig, minutes: float) -> str | None:
    """Why a run stops now (``max_steps``, ``max_epochs``, ``max_minutes``), or None."""
    if p.step >= t.max_steps:
        return "max_steps"
    if t.max_epochs and p.epoch >= t.max_epochs:
        return "max_epochs"
    if t.max_minutes and minutes >= t.max_minutes:
        return "max_minutes"
    return None


__all__ = ["Progress", "budget_spent", "stop_reason"]
