"""Norms for training: layer normalisation (``layer_norm``) and the gradients' total L2 norm
(``total_norm``), by the native CPU kernels where they apply, else PyTorch's.

The native kernel (kernels/native/layer_norm.cpp) takes float32 or bfloat16 rows with a weight
and bias of the same dtype: bf16-weights' working copy, and float32 training. PyTorch's bfloat16
backward kernel ran several times slower than its memory traffic (benchmarks/RESULTS.md).
Inference, autocast's mixed dtypes, float16 and torch.compile take ``F.layer_norm``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from transduce.kernels import native


def layer_norm(
    x: Tensor,
    normalized_shape: tuple[int, ...],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> Tensor:
    """``F.layer_norm(x, normalized_shape, weight, bias, eps)``: x (..., d) normalised over its
    last dim, computed in float32, in x's dtype; with the native kernel while training on the
    CPU (``_native_takes``)."""
    if weight is None or bias is None or not _native_takes(x, normalized_shape, weight, bias):
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    y: Tensor = _NativeLayerNorm.apply(x, weight, bias, float(eps))
    return y


def _native_takes(
    x: Tensor, normalized_shape: tuple[int, ...], weight: Tensor, bias: Tensor
) -> bool:
    """Training (a gradient wanted) on the CPU, over the last dim, x, weight and bias all
    float32 or all bfloat16, not under torch.compile, the kernels built."""
    return (
        x.device.type == "cpu"
        and torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or bias.requires_grad)
        and len(normalized_shape) == 1
        and x.dim() >= 1
        and x.size(-1) > 0
        and x.dtype in (torch.float32, torch.bfloat16)
        and weight.dtype == x.dtype
        and bias.dtype == x.dtype
        and not torch.compiler.is_compiling()
        and native.available()
    )


class _NativeLayerNorm(torch.autograd.Function):
    """Layer norm over the last dim of x (..., d) by the native kernels."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        rows = x.reshape(-1, x.size(-1)).contiguous()  # (rows, d)
        y, mean, rstd = native.layer_norm(rows, weight.contiguous(), bias.contiguous(), eps)
        ctx.save_for_backward(rows, weight, mean, rstd)
        return y.view(x.shape)

    @staticmethod
    @once_differentiable  # the native backward has no graph: a second derivative is refused
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        rows, weight, mean, rstd = ctx.saved_tensors
        g = grad.reshape(rows.shape).contiguous()  # (rows, d)
        dx, dw, db = native.layer_norm_backward(g, rows, mean, rstd, weight.contiguous())
        return dx.view(grad.shape), dw, db, None


def total_norm(tensors: list[Tensor]) -> Tensor:
    """The L2 norm of all of ``tensors`` together (``torch.nn.utils.get_total_norm``), a 0-dim
    float32 tensor on their device. Float32 or bfloat16 CPU tensors by the native kernel (squares
    summed in float64, the same for any number of threads, ~1.4x faster than PyTorch's norm:
    benchmarks/RESULTS.md; bfloat16 widened exactly, so the norm of a float32 copy); anything
    else by PyTorch."""
    if not tensors:
        return torch.zeros(())
    if native_norm_takes(tensors):
        squares = native.sum_of_squares([t.contiguous() for t in tensors])
        return squares.sqrt().float()
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch 2.6 on
    if get_total_norm is None:
        return torch.linalg.vector_norm(torch.stack([t.norm() for t in tensors]))
    norm: Tensor = get_total_norm(tensors)
    return norm


def native_norm_takes(tensors: list[Tensor]) -> bool:
    """Whether ``total_norm`` takes the native kernel: float32 or bfloat16 CPU tensors, not
    under torch.compile, the kernels built."""
    return (
        all(
            t.device.type == "cpu"
            and t.dtype in (torch.float32, torch.bfloat16)
            and t.layout == torch.strided
            for t in tensors
        )
        and not torch.compiler.is_compiling()
        and native.available()
    )


__all__ = ["layer_norm", "total_norm"]
