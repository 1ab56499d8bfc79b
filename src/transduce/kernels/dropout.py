"""Dropout on the CPU from 16-bit random draws; elsewhere PyTorch's own (one fused kernel).

On the CPU the keep-and-scale tensor comes from the native kernel (``native.dropout_keep_scale``:
SplitMix64 draws seeded from PyTorch's default generator, one pass) where it is built, else
from ``_keep_mask`` (PyTorch's ``random_``, several passes); both drop with probability
floor(p * 2^16) / 2^16, with different draws."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transduce.kernels import native


def _keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """Bernoulli(1 - p) booleans of ``shape``, True = keep.

    Uniform 16-bit integers compared with p * 2^16, so P(drop) = floor(p * 2^16) / 2^16: within
    2^-16 of p (0.0999908 for 0.1), and the kept values are scaled by exactly 1 / (1 - p). Each
    64-bit draw of the default generator (``torch.manual_seed`` governs it) gives four of them:
    drawing the random bits is most of the cost, so this is several times faster on the CPU than
    ``bernoulli_`` (benchmarks/RESULTS.md).
    """
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(2**63), 2**63 - 1)  # the full 64-bit range, so all four quarters are uniform
    threshold = int(p * 2**16) - 2**15  # int16 draws below this are dropped
    return words.view(torch.int16)[:n].view(shape) >= threshold


def _keep_scale(x: Tensor, p: float) -> Tensor:
    """(shape of x) in x's dtype: 1 / (1 - p) where kept, 0 where dropped (``_keep_mask``).

    The booleans read as bytes times a 0-dim scale: one pass, where casting them to x's dtype
    then scaling took two and the cast from bool did not vectorise (a [64, 24, 512] bfloat16
    mask 490 us against 178 on an Intel Xeon with AMX, benchmarks/RESULTS.md)."""
    scale = torch.tensor(1.0 / (1.0 - p), dtype=x.dtype, device=x.device)  # () in x's dtype
    if _native_takes(x):  # one pass, ~6.6x faster (benchmarks/RESULTS.md)
        # the seed drawn from the default generator: torch.manual_seed governs the draws
        seed = int(torch.empty((), dtype=torch.int64).random_(-(2**63), 2**63 - 1))
        return native.dropout_keep_scale(x, scale, int(p * 2**16), seed)
    keep = _keep_mask(x.shape, p, x.device)
    return keep.view(torch.uint8) * scale  # a 0-dim float operand sets the result's dtype


def _native_takes(x: Tensor) -> bool:
    """Whether the native kernel makes x's keep-and-scale tensor: a CPU tensor of 2- or 4-byte
    floats (not float64), the kernels built."""
    return (
        x.device.type == "cpu"
        and x.is_floating_point()
        and x.element_size() in (2, 4)
        and native.available()
    )


def _use_fast_dropout(x: Tensor, p: float) -> bool:
    # elsewhere (CUDA) F.dropout is one fused kernel already; under torch.compile too (inductor
    # fuses its own random draws, and Dynamo cannot trace the in-place random_: every dropout
    # would break the graph)
    return x.device.type == "cpu" and p < 1.0 and not torch.compiler.is_compiling()


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(x, p, training)``: zero each element with probability p and scale the rest by
    1 / (1 - p); on the CPU with ``_keep_mask``."""
    if not training or p == 0.0:
        return x
    if not _use_fast_dropout(x, p):
        return F.dropout(x, p, training)
    return x * _keep_scale(x, p)


def dropout_add(residual: Tensor, x: Tensor, p: float, training: bool) -> Tensor:
    """``residual + dropout(x, p, training)``. On the CPU one fused multiply-add
    (``torch.addcmul``) when both have one dtype; under autocast (float32 residual stream,
    bfloat16 ``x``) a bfloat16 multiply and a mixed add, since ``addcmul`` would first copy its
    operands to float32."""
    if not training or p == 0.0:
        return residual + x
    if not _use_fast_dropout(x, p):
        return residual + F.dropout(x, p, training)
    scale = _keep_scale(x, p)
    if residual.dtype == x.dtype:
        return torch.addcmul(residual, x, scale)
    return residual + x * scale


__all__ = ["dropout", "dropout_add"]
