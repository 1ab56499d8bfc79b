"""x W^T + b on the library that multiplies fastest on this CPU: MKL or oneDNN.

PyTorch sends float32 products on the CPU to MKL, which picks its sgemm kernels by CPU vendor:
on an AMD Zen 5 (AVX-512) it ran at 120-220 GFLOP/s where oneDNN, also inside PyTorch, ran at
260-470 (2 threads; benchmarks/RESULTS.md, 2026-11-24). On Intel CPUs MKL was as fast or faster.
So float32 products on x86 CPUs not made by Intel go through oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``), with a backward of the same library; everything else
(other CPUs and dtypes, GPUs, autocast) through ``F.linear``. Both compute the same function up
to float rounding.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

CpuMatmul = Literal["auto", "mkl", "onednn"]

# The weight gradient g^T x of a projection with more entries than this (the vocabulary's) ran
# slower through oneDNN than MKL on the AMD Zen 5 (1536 x 256 -> 8000: 39 against 29 ms)
_ONEDNN_WEIGHT_GRAD_MAX_ELEMENTS = 1 << 20

# Weights with at most this many entries multiply one row faster through MKL than through
# oneDNN even on the AMD Zen 5 (256 x 768: 9 against 19 us; 512 x 1536: 41 against 34)
ONE_ROW_MKL_MAX_ELEMENTS = 1 << 19

_cpu_matmul: CpuMatmul = "auto"

_PACKED_FOR_ROWS = 128  # see onednn_packed


@functools.lru_cache(maxsize=1)
def _cpu_vendor() -> str:
    """The CPU's vendor_id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...); "" where
    there is none (not Linux, not x86)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's linear operator (builds with mkldnn have it)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def use_onednn(cpu_matmul: CpuMatmul, weight: Tensor) -> bool:
    """Whether float32 products against ``weight`` go through oneDNN: "onednn" (an error where it
    is missing), "mkl" never, "auto" for float32 CPU weights on x86 CPUs not made by Intel. A
    weight off the CPU (a GPU's) never does: the choice is among CPU libraries."""
    if cpu_matmul not in ("auto", "mkl", "onednn"):
        raise ValueError(f"cpu_matmul must be 'auto', 'mkl' or 'onednn', not {cpu_matmul!r}")
    if cpu_matmul == "onednn" and not onednn_available():
        raise ValueError("cpu_matmul='onednn': this PyTorch build has no oneDNN (mkldnn)")
    if cpu_matmul == "mkl" or weight.device.type != "cpu":
        return False
    if cpu_matmul == "onednn":
        return True
    return (
        weight.dtype == torch.float32
        and _cpu_vendor() not in ("", "GenuineIntel")
        and onednn_available()
    )


def set_cpu_matmul(cpu_matmul: CpuMatmul) -> CpuMatmul:
    """Choose the library of ``linear`` for the whole process ("auto" by default); returns the
    previous choice. For comparisons and tests; "auto" is the fast one."""
    global _cpu_matmul
    use_onednn(cpu_matmul, torch.empty(0))  # checks the value (and oneDNN for "onednn")
    previous, _cpu_matmul = _cpu_matmul, cpu_matmul
    return previous


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (N, in) -> x W^T + b (N, out) by oneDNN's inner product, W (out, in); no autograd."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_packed(weight: Tensor) -> Tensor:
    """W (out, in) -> a copy in oneDNN's own blocked layout (an opaque mkldnn tensor) that
    ``onednn_linear`` takes in place of W, with the same results, for any row count: a plain W
    is reordered on every call. On the AMD Zen 5 it made the decoding products 1.05-1.2x faster
    at 100-640 rows and up to 2x at 2-32 (benchmarks/RESULTS.md, 2026-11-24). A plain copy where
    this PyTorch lacks the operator."""
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return weight.contiguous().clone()
    # the row count only guides oneDNN's choice of layout; 32 to 1024 measured the same
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACKED_FOR_ROWS)


def _onednn_nd(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``onednn_linear`` for x (..., in) -> (..., out)."""
    out = onednn_linear(x.reshape(-1, x.size(-1)), weight, bias)  # (N, out)
    return out.view(*x.shape[:-1], weight.size(0))


class _OneDnnLinear(torch.autograd.Function):
    """x (..., in), W (out, in), b (out,) -> (..., out), forward and backward through oneDNN."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x.reshape(-1, x.size(-1)), weight)  # x as (N, in)
        ctx.has_bias = bias is not None
        return _onednn_nd(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x2, weight = ctx.saved_tensors
        g = grad.reshape(-1, weight.size(0))  # (N, out)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # g W = g (W^T)^T: W^T (in, out) as oneDNN's weight
            grad_x = onednn_linear(g, weight.t(), None).view(*grad.shape[:-1], weight.size(1))
        if ctx.needs_input_grad[1]:  # g^T x (out, in)
            if weight.numel() <= _ONEDNN_WEIGHT_GRAD_MAX_ELEMENTS:
                grad_w = onednn_linear(g.t(), x2.t(), None)
            else:
                grad_w = g.t() @ x2
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in), bias (out,) -> (..., out),
    through oneDNN where ``use_onednn`` says so for this process's choice and the operands are
    float32 outside autocast, not empty and not one row against a small weight (see the module
    docstring)."""
    if (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.numel() > 0  # oneDNN refuses a weight gradient with no rows
        and (x.numel() > x.size(-1) or weight.numel() > ONE_ROW_MKL_MAX_ELEMENTS)
        and use_onednn(_cpu_matmul, weight)
        and not torch.is_autocast_enabled("cpu")
    ):
        operands = (x, weight) if bias is None else (x, weight, bias)
        if torch.is_grad_enabled() and any(t.requires_grad for t in operands):
            return _OneDnnLinear.apply(x, weight, bias)
        # no graph to record: the autograd Function's own cost (~10 us a call) would be waste
        return _onednn_nd(x, weight, bias)
    return F.linear(x, weight, bias)


__all__ = [
    "ONE_ROW_MKL_MAX_ELEMENTS",
    "CpuMatmul",
    "linear",
    "onednn_available",
    "onednn_linear",
    "onednn_packed",
    "set_cpu_matmul",
    "use_onednn",
]
