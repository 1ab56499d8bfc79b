"""The learning-rate schedule of eq. 3 as a pure function."""

from __future__ import annotations

from transduce.config import Config


def rate(step: int, *, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (eq. 3).

    Linear warm-up for ``warmup`` steps, then decay with the inverse square root of the step.
    ``step`` counts optimizer updates from 1; step 0 is treated as step 1.
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cooldown(done: float, *, fraction: float) -> float:
    """Multiplier on the learning rate that anneals it linearly to 0 over the last ``fraction``
    of the training budget; ``done`` is the share of the budget spent, in [0, 1].

    Not in the paper: eq. 3 alone leaves the rate high when a short budget (a wall-clock limit)
    ends, and a linear cool-down at the end ("warmup-stable-decay") gets most of what a fully
    decayed schedule gives. ``fraction`` 0 turns it off (the multiplier stays 1).
    """
    if fraction <= 0.0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - done) / fraction))


def scheduled_rate(step: int, cfg: Config, done: float) -> float:
    """The learning rate of update ``step`` (from 1) of a run of ``cfg``: eq. 3 (``rate``)
    times the ``cooldown`` at ``done``, the share of the budget spent."""
    t = cfg.train
    return rate(step, d_model=cfg.model.d_model, warmup=t.warmup, factor=t.lr_factor) * cooldown(
        done, fraction=t.cooldown
    )
