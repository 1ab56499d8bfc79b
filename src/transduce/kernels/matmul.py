"""x W^T + b on the library that multiplies fastest on this CPU: MKL or oneDNN.

PyTorch sends float32 products on the CPU to MKL, which picks its sgemm kernels by CPU vendor: on
an AMD Zen 5 (AVX-512) oneDNN, also inside PyTorch, multiplied about twice as fast; on Intel CPUs
MKL was as fast or faster (benchmarks/RESULTS.md). So with ``matmul="auto"`` float32 products on
x86 CPUs not made by Intel go through oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``), with a backward of the same library; everything else
(other CPUs and dtypes, GPUs, autocast) through ``F.linear``. Both compute the same function up
to float rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transduce.kernels import native
from transduce.kernels.options import Matmul, check_choice

# The weight gradient g^T x of a projection with more entries than this (the vocabulary's) ran
# slower through oneDNN than through MKL on the AMD Zen 5 (benchmarks/RESULTS.md)
_ONEDNN_WEIGHT_GRAD_MAX_ELEMENTS = 1 << 20

# Weights with at most this many entries multiply one row faster through MKL than through
# oneDNN even on the AMD Zen 5 (benchmarks/RESULTS.md)
ONE_ROW_MKL_MAX_ELEMENTS = 1 << 19

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


def use_onednn(matmul: Matmul, weight: Tensor) -> bool:
    """Whether float32 products against ``weight`` go through oneDNN: "onednn" (an error where it
    is missing), "mkl" never, "auto" for float32 CPU weights on x86 CPUs not made by Intel. A
    weight off the CPU (a GPU's) never does: the choice is among CPU libraries."""
    if matmul == "auto":  # the common case first: one comparison per call
        pass
    elif matmul == "onednn":
        if not onednn_available():
            raise ValueError("matmul='onednn': this PyTorch build has no oneDNN (mkldnn)")
    else:
        check_choice("matmul", matmul, Matmul)
    if matmul == "mkl" or weight.device.type != "cpu" or torch.compiler.is_compiling():
        return False  # (inductor cannot lower oneDNN's operator: F.linear under torch.compile)
    if matmul == "onednn":
        return True
    return (
        weight.dtype == torch.float32
        and _cpu_vendor() not in ("", "GenuineIntel")
        and onednn_available()
    )


def use_native_f32(matmul: Matmul, weight: Tensor) -> bool:
    """Whether a decoding projection's float32 products go through our own kernel
    (``native.f32_linear``, W packed once into panels): with "auto", float32 CPU weights on
    Intel CPUs with AVX-512 and the native kernels built. There it beat MKL's ``addmm`` on W^T
    at a search step's row counts, where each weight comes from the L3 cache (benchmarks/
    RESULTS.md); on AMD CPUs it is unmeasured, so oneDNN stays. "mkl" or "onednn" pin the
    library."""
    if matmul != "auto":
        check_choice("matmul", matmul, Matmul)
        return False
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and _cpu_vendor() == "GenuineIntel"
        and native.available()
        and native.f32_gemm_available()
    )


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (N, in) -> x W^T + b (N, out) by oneDNN's inner product, W (out, in); no autograd."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_packed(weight: Tensor) -> Tensor:
    """W (out, in) -> a copy in oneDNN's own blocked layout (an opaque mkldnn tensor) that
    ``onednn_linear`` takes in place of W, with the same results, for any row count: a plain W
    is reordered on every call (the packed copy is faster, most at few rows; benchmarks/
    RESULTS.md). A plain copy where this PyTorch lacks the operator."""
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


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, matmul: Matmul = "auto"
) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., in), weight (out, in), bias (out,) -> (..., out),
    through oneDNN where ``use_onednn(matmul, weight)`` says so and the operands are float32
    outside autocast, not empty and not one row against a small weight (see the module
    docstring)."""
    if (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.numel() > 0  # oneDNN refuses a weight gradient with no rows
        and (x.numel() > x.size(-1) or weight.numel() > ONE_ROW_MKL_MAX_ELEMENTS)
        and use_onednn(matmul, weight)
        and not torch.is_autocast_enabled("cpu")
    ):
        operands = (x, weight) if bias is None else (x, weight, bias)
        if torch.is_grad_enabled() and any(t.requires_grad for t in operands):
            return _OneDnnLinear.apply(x, weight, bias)
        # no graph to record: the autograd Function's own cost per call would be waste
        return _onednn_nd(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict keys) computed by ``linear`` with the
    library ``matmul``. An input of another dtype than the weight is cast to it outside
    autocast: attention hands back float32 on the CPU for a low-precision model
    (``attention_input``)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, matmul: Matmul = "auto"
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        check_choice("matmul", matmul, Matmul)
        self.matmul = matmul

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) -> (..., out)."""
        if x.dtype != self.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            x = x.to(self.weight.dtype)
        return linear(x, self.weight, self.bias, self.matmul)


def stacked_weights(layers: Sequence[nn.Linear]) -> tuple[Tensor, Tensor | None]:
    """The weights of ``layers`` (same in_features) stacked: (sum(out_features), in) and their
    biases (sum(out_features),), or None without biases."""
    weight = torch.cat([layer.weight for layer in layers])  # (sum(out), in)
    if layers[0].bias is None:
        return weight, None
    return weight, torch.cat([layer.bias for layer in layers])  # (sum(out),)


def stacked_linear(x: Tensor, layers: Sequence[Linear]) -> tuple[Tensor, ...]:
    """Each of ``layers`` applied to x (..., in), as one product against their stacked weights:
    one matrix product, one input cast under autocast and one backward product per operand
    instead of ``len(layers)``. Returns views (column slices) of the one output."""
    if len(layers) == 1:
        return (layers[0](x),)
    weight, bias = stacked_weights(layers)
    out = linear(x, weight, bias, layers[0].matmul)  # (..., sum(out))
    return out.split([layer.out_features for layer in layers], dim=-1)


def fp16_refusal(device: torch.device) -> str | None:
    """Why decoding in float16 weights should not run on ``device`` (one line), or None where it
    may: a CUDA GPU. A CPU emulates float16 products (SMALL greedy on 32 sentences took 50 times
    as long as in float32 on the AMD Zen 5, benchmarks/RESULTS.md); bfloat16 is its half-width
    type."""
    if device.type == "cuda":
        return None
    return (
        f"float16 decoding is for CUDA GPUs; a {device.type} emulates float16 products (tens "
        "of times slower than fp32): use bf16, fp32 or, on a CPU, int8"
    )


__all__ = [
    "ONE_ROW_MKL_MAX_ELEMENTS",
    "fp16_refusal",
    "Linear",
    "linear",
    "onednn_available",
    "onednn_linear",
    "onednn_packed",
    "stacked_linear",
    "stacked_weights",
    "use_native_f32",
    "use_onednn",
]
