"""The kernels' choices as typed options: one frozen value passed to whatever computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# The library of float32 matrix products on the CPU. "auto": oneDNN on x86 CPUs not made by
# Intel (where MKL runs without its AVX-512 kernels), MKL elsewhere; the decoding engine's
# projections on Intel CPUs with AVX-512 take our own kernel (kernels.matmul.use_native_f32).
Matmul = Literal["auto", "mkl", "onednn"]

# The path of attention. "auto": the fused kernel, except where the formula is faster (training
# on the CPU with short keys); "fused": always PyTorch's fused kernel; "formula": always the
# explicit softmax(QK^T/sqrt(d_k))V.
AttentionPath = Literal["auto", "fused", "formula"]


def check_choice(name: str, value: str, kind: object) -> None:
    """A ValueError naming ``name`` unless ``value`` is one of the Literal ``kind``'s values."""
    allowed = get_args(kind)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}")


@dataclass(frozen=True)
class KernelOptions:
    """How a model computes: the CPU matrix library and the attention path. Neither changes the
    function computed, only its speed (and float rounding)."""

    matmul: Matmul = "auto"
    attention: AttentionPath = "auto"

    def __post_init__(self) -> None:
        check_choice("matmul", self.matmul, Matmul)
        check_choice("attention", self.attention, AttentionPath)


__all__ = ["AttentionPath", "KernelOptions", "Matmul", "check_choice"]
