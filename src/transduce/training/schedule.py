"""The learning-rate schedule of eq. 3 as a pure function."""

from __future__ import annotations


def rate(step: int, *, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (eq. 3).

    Linear warm-up for ``warmup`` steps, then decay with the inverse square root of the step.
    ``step`` counts optimizer updates from 1; step 0 is treated as step 1.
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
