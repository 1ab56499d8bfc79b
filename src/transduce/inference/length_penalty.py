"""The GNMT length penalty used to rank finished hypotheses (Wu et al. 2016, eq. 14)."""

from __future__ import annotations

from typing import overload

import torch
from torch import Tensor


@overload
def length_penalty(length: float, alpha: float) -> float: ...
@overload
def length_penalty(length: Tensor, alpha: float) -> Tensor: ...


def length_penalty(length: float | Tensor, alpha: float) -> float | Tensor:
    """lp(Y) = ((5 + |Y|) / 6) ** alpha.

    ``|Y|`` counts the generated tokens *including* the final EOS (BOS is not generated and never
    counts): the empty output ``[] + EOS`` has ``|Y| = 1`` and ``lp = 1`` for every alpha. A
    finished hypothesis scores ``log P(Y) / lp(|Y|)``. With ``alpha = 0``, ``lp = 1`` (plain
    log-probability); larger alphas favour longer outputs. An integer tensor gives a float32
    tensor, a Python number a float.
    """
    if isinstance(length, Tensor):
        if not length.is_floating_point():
            length = length.to(torch.float32)
        return ((5.0 + length) / 6.0) ** alpha
    return ((5.0 + length) / 6.0) ** alpha


__all__ = ["length_penalty"]
